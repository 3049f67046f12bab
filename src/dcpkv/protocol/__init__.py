"""The memcached binary protocol and DCP, as a sans-I/O codec (no sockets in here)."""
