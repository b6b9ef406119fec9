"""The facility-wide directory on etcd (v3 API, through etcd's HTTP/JSON gateway).

- ``gateway.py``: a small typed client of the gateway (``/v3/kv/*``, ``/v3/lease/*``,
  ``/v3/watch``) over httpx, failing over between the endpoints of a cluster.
- ``registration.py``: a server's claim on its name and devices, held by a lease that a named
  thread keeps alive, re-made after an outage.
- ``directory.py``: :class:`EtcdDirectory`, the ``Directory`` of a client (a cache of the
  device keys kept current by a watch, so a moved device is followed at once) and the
  registry of a server.

May import: the shared business modules (``rda.business.config``, ``rda.business.directory``)
and ``rda.serialization``; never ``rda.business.client`` or ``rda.business.server``, which both
use it.
"""
