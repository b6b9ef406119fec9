"""rda.admin: admin commands, the `rda` command-line tool and the Prometheus endpoint."""
