"""The package's version, in the base layer so that any module may name it
(the OpenTelemetry tracer's instrumentation version) without importing the
package root."""

__version__ = "0.12.0"
