"""The AMQP side: everything that speaks to RabbitMQ through pika, on the engine loop.

The consuming connection (``supervisor``) and each binding's channel on it
(``channel``: it runs the binding's handler on what it receives and sends the
action itself), and the publishing connection (``publisher``, on the confirm
link ``replay``'s partitions use too). The core never imports this package; it
sees a publisher only through ``dispatcher.delivery.seams.ConfirmingPublisher``
and hands a binding's channel its ``seams.Handle``. docs/modules.md lists the
modules.
"""
