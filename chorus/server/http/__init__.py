"""The HTTP front door: routes split by resource (``speech``, ``voices``, ``models``,
``operations``), each parsing its request, making one call on the service and mapping its
``APIError`` onto an HTTP answer; ``middleware`` holds what every request goes through, and
``chorus.server.app`` puts them together."""
