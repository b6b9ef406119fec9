"""rda.business.client: the client runtime.

``ClientService`` (service.py) owns the transport and the client's threads; access points
(access.py) build requests; connections.py, endpoints.py and reconnect.py keep one connection
per server and bring it back after a loss; lanes.py sends from the caller's thread;
replies.py completes futures; subscriptions.py delivers notifications; timer.py runs deadlines
and retries; statistics.py counts.

May import: the shared business modules (``rda.business.common``, ``config``, ``directory``,
``policy``, ``scheduler``, ``security``), ``rda.transport``, ``rda.serialization``. Never
``rda.business.server`` (tests/test_layout.py checks it).
"""
