"""The IO shell around the engine: the ZMQ server, the clients, metrics, endpoints and child processes."""
