"""The AMQP side: everything that speaks to RabbitMQ through pika.

- ``supervisor``: the consuming connection: rotation over a cluster's nodes,
  reconnects, ticks for ``/healthz``, the batches to and from the engine.
- ``consumer``: one binding's channel: generations, prefetch room, applying
  verdicts to the channel generation a message arrived on.
- ``params``: connection parameters for each broker node, the rotation over
  them, and how pika's errors are described.
- ``confirm_link``: the one publishing design: a connection with a confirm
  channel, the window of unconfirmed publishes, returns, loss handling.
- ``publisher``: the service's publisher (dead letters, replies) on it; the
  replay job's ``pipeline.confirms`` is the other user.
- ``confirm_window``: publisher-confirm bookkeeping, pika-free.
- ``amqp_properties``: a message whose properties pika cannot decode is kept
  (and dead-lettered with the reason), not lost.

The core never imports this package; it sees a publisher only through
``dispatcher.seams.ConfirmingPublisher``.
"""
