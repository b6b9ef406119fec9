"""rda gateways: rda devices served to other control systems' tools (``rda gateway``).

``rda gateway pva`` (extra ``[pva]``, p4p) serves every property of the directory's devices
as pvAccess PVs, so EPICS tools (Phoebus, PyDM, the Archiver Appliance, ``pvget``, p4p)
read, monitor and (when allowed) write rda devices (docs/gateway.md).

Modules, one job each:

- ``naming``: PV names (``DEV/PROP``, ``DEV/PROP.field``, ``@SELECTOR``) <-> parts;
- ``nt``: rda types and values -> pvAccess types and values (NTScalar, NTScalarArray,
  NTNDArray, the property structure);
- ``metadata``: alarms, units, precision and limits -> ``alarm``, ``display``, ``control``,
  ``valueAlarm``;
- ``feeds``: one rda subscription per (device, property, selector), shared by its PVs;
- ``pvs``: one PV (a p4p ``SharedPV``) showing a feed;
- ``puts``: puts -> rda sets, the rule file, the put log;
- ``catalog``: which devices and properties exist (directory + admin ``devices``);
- ``pva``: ``PvaGateway``, the p4p server and its provider; ``cli``: the command.

A client of rda, like the panel: a facade package that may import every layer; nothing below
imports it (``rda._cli`` adds the command only when p4p imports).
"""
