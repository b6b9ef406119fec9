"""rda.admin.cli: the ``rda`` command-line tool.

main.py is the click group, which imports each command's module when the command is used;
options.py is what the group needs before that (global options, exit codes, ``CliError``);
access.py is get, set, subscribe and admin; directory.py is ``rda directory``; run.py is
``rda serve`` and ``rda bench``; keys.py is ``rda keys``; values.py parses ``field=value``
arguments; common.py holds what the commands share (error reporting, client construction).

May import: ``rda.admin`` (registry, format, metrics), ``rda.business``, ``rda.transport``,
``rda.serialization`` and ``rda.demo``; never ``rda.pipeline`` (the ``rda`` facade,
rda/_cli.py, adds the history commands).
"""
