"""rda.transport: the wire protocol (sans-I/O) and the dispatcher threads over DEALER/ROUTER."""
