"""rda.business.client: the client runtime.

``ClientService`` (service.py) owns the transport and holds the parts below; access points
(access.py) build requests; requests.py is the request table (ids, pending requests,
deadlines, completion and its counters); connections.py, endpoints.py and reconnect.py keep one
connection per server and bring it back after a loss; lanes.py sends from the caller's thread;
replies.py completes futures; subscription_set.py routes notifications to the subscriptions of
subscriptions.py, which deliver them; history.py queries recorded history; timer.py runs
deadlines and retries; statistics.py counts.

May import: the shared business modules (``rda.business.common``, ``config``, ``directory``,
``policy``, ``scheduler``, ``security``), ``rda.transport``, ``rda.serialization``. Never
``rda.business.server`` (tests/test_layout.py checks it).
"""
