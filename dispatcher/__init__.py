"""dispatcher: deliver RabbitMQ messages as CloudEvents over HTTP.

The package is grouped by a message's path: ``broker/`` receives it (pika),
``event/`` reads it as a CloudEvent, ``delivery/`` decides what happens to it
(``delivery/handler.py``: where acks are decided), ``http/`` sends it to the
subscriber (libcurl), ``store/`` shares duplicate suppression between
replicas (Redis); ``observe/`` logs, counts and traces it, ``ops/`` answers
probes and scrapes, ``config/`` and ``cesql/`` are what a binding says,
``credentials/`` the files that rotate under a running service, and
``pipeline/`` the batch jobs. At the root: the process (``cli``, ``service``,
``resolve``, ``signals``), the event loop (``loop``) and the error tree
(``errors``). docs/modules.md lists every module; docs/design.md tells how
they work together.
"""

__version__ = "0.1.0"
