"""dispatcher: deliver RabbitMQ messages as CloudEvents over HTTP.

Module map (one concept each):

- ``config``      YAML + environment -> frozen ``Settings``; every error names its key.
- ``events``      AMQP message <-> ``Event`` <-> HTTP request/response (the CloudEvent mapping).
- ``retry``       when to retry an HTTP status and how long to wait (backoff, Retry-After).
- ``delivery``    HTTP attempts against the subscriber, per-attempt timeout and overall deadline.
- ``deadletter``  what a dead-lettered event looks like and where it is sent.
- ``publisher``   one long-lived confirmed publishing connection (dead letters, replies).
- ``handler``     one message from delivery to its verdict: **where acks are decided**.
- ``broker``      the connection supervisor: owns pika, consumes, applies verdicts.
- ``pool``        bounded worker threads (HTTP work never runs on the pika thread).
- ``metrics``, ``logs``  the operations interface, named as PRODUCT.md says.
- ``service``     wires the above together; ``cli`` parses commands.
"""

__version__ = "0.1.0"
