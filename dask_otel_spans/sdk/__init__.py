"""The OpenTelemetry SDK as this package builds it: providers from arguments, globals,
``OTEL_*`` or the embedded default; OTLP exporters; OTLP-JSON lines files; export
health."""
