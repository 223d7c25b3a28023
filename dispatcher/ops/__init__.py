"""The operations listener: /metrics, /healthz, /readyz."""
