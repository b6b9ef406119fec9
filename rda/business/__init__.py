"""rda.business: the RDA3 business layer, above the transport.

Sub-packages: ``client`` (the client runtime) and ``server`` (the server runtime), which never
import each other. Beside them, the modules both use: ``common`` (AcquiredData), ``config``,
``directory`` (finding servers), ``policy`` (RBAC), ``scheduler`` (grouped worker threads) and
``security`` (CURVE keys); these import neither sub-package.

May import: ``rda.transport`` and ``rda.serialization``; never ``rda.admin``,
``rda.pipeline`` or the ``rda`` facade.
"""
