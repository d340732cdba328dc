"""gpuenvd: a privileged service that lends clock locks to unprivileged users.

    server.py    the Unix-socket server (one thread per connection) and its sampler
    protocol.py  versioned line-delimited JSON: parsing, validation, size limits
    leases.py    leases on top of gpuenv.clocks: tied to a connection or standing
    auth.py      SO_PEERCRED identities and the INI config of who may lock what
    metrics.py   the optional Prometheus endpoint (prometheus-client, lazy)
    client.py    what gpuenv's own commands use when they are not root

Nothing is imported here, so `gpuenv.daemon.client` stays cheap to import.
"""
