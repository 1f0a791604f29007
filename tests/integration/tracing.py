"""OpenTelemetry tracing as an application sets it up, with spans written to a file.

``IT_TRACE_FILE`` names the file: :mod:`tests.integration.app` calls :func:`trace_to_file`
at import when it is set, so the producer and the worker, each process of it, instrument
Celery as OpenTelemetry's docs say (``CeleryInstrumentor().instrument()``) with an SDK
``TracerProvider``. Every finished span becomes one JSON line: trace id, span id, parent
span id, name, kind, attributes and the process.

Set up at import, the provider and the instrumentation are inherited by a prefork pool's
children. That is enough here, where OpenTelemetry's docs set them up in
``worker_process_init``: those docs guard a ``BatchSpanProcessor``, whose thread a fork
leaves behind. A ``SimpleSpanProcessor`` exports each span as it ends, in the process
that ended it, and the exporter opens the file for each export, so nothing is lost at
a pool process's ``os._exit`` and no file object is shared across a fork.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    """Appends each finished span to ``path`` as one JSON line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(_as_dict(span)) + "\n" for span in spans)
        with open(self.path, "a") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _as_dict(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "name": span.name,
        "kind": span.kind.name,
        "attributes": {key: str(value) for key, value in (span.attributes or {}).items()},
        "pid": os.getpid(),
    }


def trace_to_file(path: str) -> None:
    """Trace this process's Celery publishes and task runs into ``path``."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()


def spans(path: str) -> list[dict[str, Any]]:
    """The spans written to ``path`` so far."""
    if not os.path.exists(path):
        return []
    with open(path) as written:
        return [json.loads(line) for line in written if line.strip()]
