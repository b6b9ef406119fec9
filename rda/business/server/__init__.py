"""rda.business.server: the server runtime.

``ServerBuilder`` (builder.py) assembles a ``Server`` (runtime.py), which owns the transport,
the worker scheduler and the subscription registry (subscriptions.py); dispatch.py routes each
request to its handler and encodes the reply; requests.py holds the request objects handlers
see; devices.py is the declarative ``Device``/``prop`` layer; statistics.py counts.

May import: the shared business modules (``rda.business.common``, ``config``, ``directory``,
``policy``, ``scheduler``, ``security``), ``rda.transport``, ``rda.serialization``. Never
``rda.business.client`` (tests/test_layout.py checks it).
"""
