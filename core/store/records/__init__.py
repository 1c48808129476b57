"""The SQL behind the gateway's channels, one module per kind of record, so route and channel code
says what it records and reads, not how."""
