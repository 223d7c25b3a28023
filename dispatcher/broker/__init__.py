"""The AMQP side: everything that speaks to RabbitMQ through pika.

- ``supervisor``: the consuming connection, its channels and their
  generations, reconnects, and applying the engine's verdicts (ack, nack,
  reject) to the channel generation a message arrived on.
- ``params``: connection parameters for each broker node, the rotation over a
  cluster's nodes, and how pika's errors are described.
- ``publisher``: the one publishing design (confirms, a bounded window,
  reconnects) that dead letters and replies go through.
- ``confirm_window``: publisher-confirm bookkeeping, pika-free.
- ``amqp_properties``: a message whose properties pika cannot decode is kept
  (and dead-lettered with the reason), not lost.

The core (``handler``, ``deadletter``, ``reply``) never imports this package;
it sees a publisher only through ``dispatcher.seams``.
"""
