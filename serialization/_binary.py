"""Binary codec (the wire format). Being written; see docs/serialization.md."""
