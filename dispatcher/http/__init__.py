"""The HTTP side: everything that speaks HTTP.

- ``client``: the libcurl multi engine on the delivery loop (pycurl); every
  failure is a value, never an exception.
- ``endpoint``: where a request goes: a URL, its TLS files, the proxy.
- ``target``: one URL with a binding's retry policy: attempts, timeouts,
  retry waits and the whole-delivery deadline.
- ``server``: the operations server (``/healthz``, ``/readyz``, ``/metrics``).

The core never imports this package; it sees a target only through
``dispatcher.seams.Target``.
"""
