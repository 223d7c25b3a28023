"""The AMQP side: everything that speaks to RabbitMQ through pika.

- ``pika_loop``: pika's connections on the engine loop (``LoopConnection``):
  one thread from socket to ack, the frames of one loop pass in one write.
- ``supervisor``: the consuming connection: rotation over a cluster's nodes,
  reconnects, ticks for ``/healthz``, messages to the engine and verdicts back.
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
``dispatcher.delivery.seams.ConfirmingPublisher``.
"""
