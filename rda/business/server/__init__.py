"""rda.business.server: the server runtime.

``ServerBuilder`` (builder.py) assembles a ``Server`` (runtime.py), which owns the transport,
the worker scheduler, the subscription registry (subscriptions.py) and the objects that serve
requests: dispatch.py is the transport's handler and the peer table, runner.py runs each
request and encodes and sends its answer (replies.py: the frames), lifecycle.py follows each
subscription from accepted to ended, and the RBAC gate lives in ``rda.business.policy``;
requests.py holds the request objects handlers see; devices.py is the declarative
``Device``/``prop`` layer; statistics.py counts.

May import: the shared business modules (``rda.business.common``, ``config``, ``directory``,
``policy``, ``scheduler``, ``security``), ``rda.transport``, ``rda.serialization``. Never
``rda.business.client`` (tests/test_layout.py checks it).
"""
