"""rda.admin.cli: the ``rda`` command-line tool.

main.py is the click group and the access-point commands (get, set, subscribe, admin,
directory); run.py is ``rda serve`` and ``rda bench``; keys.py is ``rda keys``; values.py
parses ``field=value`` arguments; common.py holds what every command shares (exit codes,
client construction, error printing).

May import: ``rda.admin`` (registry, format, metrics), ``rda.business``, ``rda.transport``,
``rda.serialization`` and ``rda.demo``; never ``rda.pipeline`` (the ``rda`` facade,
rda/_cli.py, adds the history commands).
"""
