"""dispatcher: deliver RabbitMQ messages as CloudEvents over HTTP.

Module map (one concept each):

- ``config``      YAML + environment -> frozen ``Settings``; every error names its key.
- ``events``      AMQP message <-> ``Event`` <-> HTTP request/response (the CloudEvent mapping).
- ``retry``       when to retry an HTTP status and how long to wait (backoff, Retry-After cap).
- ``delivery``    HTTP attempts against one URL, per-attempt timeout and overall deadline.
- ``deadletter``  what a dead-lettered event looks like and where it is sent.
- ``reply``       where a subscriber's reply event goes.
- ``dedupe``      duplicate suppression of redeliveries.
- ``handler``     one message from delivery to its verdict: **where acks are decided**.
- ``engine``      the thread that runs every delivery, and the batches to and from ``broker``.
- ``loop``        the engine's event loop: futures, tasks, timers, interruptible waits.
- ``httpclient``  HTTP through libcurl's multi interface on that loop.
- ``broker``      the connection supervisor: owns pika, consumes, applies verdicts.
- ``publisher``   one long-lived confirm channel for dead letters and replies.
- ``confirm_window``  publishes in flight matched to confirms and returns (also ``replay``).
- ``metrics``, ``logs``  the operations interface, named as PRODUCT.md says.
- ``service``     wires the above together; ``cli`` parses commands.
"""

__version__ = "0.1.0"
