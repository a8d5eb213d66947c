"""The demo's views: enqueue a Django Task from a request, and show its result."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from .tasks import count_reviewed


@require_POST
def enqueue(request: HttpRequest) -> JsonResponse:
    """Enqueue ``count_reviewed``; a worker runs it. Answer with where to see the result."""
    result = count_reviewed.enqueue()
    return JsonResponse({"id": result.id, "status": result.status}, status=202)


def result(request: HttpRequest, result_id: str) -> JsonResponse:
    """Show the state (and, once finished, the return value) of an enqueued task."""
    outcome = count_reviewed.get_result(result_id)
    body = {"id": outcome.id, "status": outcome.status}
    if outcome.is_finished and not outcome.errors:
        body["return_value"] = outcome.return_value
    return JsonResponse(body)
