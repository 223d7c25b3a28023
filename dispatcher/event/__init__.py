"""CloudEvents as the service reads and writes them: the event, its protocol
bindings (AMQP, HTTP) and the JSON format."""
