"""dispatcher: deliver RabbitMQ messages as CloudEvents over HTTP.

The core, flat modules that decide what happens to a message and never import
pika, libcurl or redis (``tests/unit/test_boundaries.py`` holds them to it):

- ``events``      the ``Event`` and its validation; the CloudEvents specification's
                  other parts each have a module named after them:
- ``amqp_binding``  the AMQP protocol binding: where a message becomes a CloudEvent
                  (or a wrapped stand-in), and the headers an event is published with.
- ``http_binding``  the HTTP protocol binding: an event as an HTTP request, a reply
                  read from a response.
- ``json_format``   the JSON event format, both ways (structured mode, archive lines).
- ``handler``     one message from receipt to its ``Action``: **where acks are decided**.
- ``retry``       which answers are retried and how long to wait.
- ``dedupe``      duplicate suppression of redeliveries (memory, then the shared store).
- ``deadletter``  what a dead-lettered event looks like and where it is sent.
- ``reply``       where a subscriber's reply event goes.
- ``filters``     a binding's Trigger filters, compiled once.
- ``bearer``      the bearer token file, re-read when it changes.
- ``engine``      the loop thread that runs every delivery; each verdict to its channel at once.
- ``loop``, ``waits``  the engine's event loop, and the waits shutdown ends.
- ``seams``       the Protocols the core sees the outside through, and their values.
- ``tls``         a TLS context from ``tls`` settings, for pika and for checking curl's files.

The sides and the rest:

- ``broker/``     pika on the engine loop (``pika_loop``): the supervisor, each binding's
  consumer, connection parameters and node rotation, the one publishing design
  (``confirm_link``).
- ``http/``       libcurl: the client engine, endpoints, the retrying target; the ops server.
- ``redis_claims``  the shared dedupe store's client (redis-py).
- ``config/``     settings data, its sources (file, environment, Knative), validation,
  value parsers and the rendering ``check`` prints.
- ``pipeline/``   the PySpark jobs: archive, report, replay.
- ``resolve``     what the settings name, read with pika, ssl, the proxy variables and
                  redis-py before anything starts: the one step ``check`` and ``run`` share.
- ``service``     wires it all together; ``cli`` parses commands; ``signals``,
  ``logs`` (and ``log_output``: stdout that never blocks the loop), ``metrics``,
  ``errors`` (the one error tree).

``docs/design.md`` tells how they work together.
"""

__version__ = "0.1.0"
