"""The HTTP side, outbound: every request to a subscriber, a dead-letter sink or a
reply URL, through libcurl. The core sees it only through
``dispatcher.delivery.seams.Target``."""
