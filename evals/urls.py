"""The evals API, mounted under ``/api/v1/evals/``."""

from django.urls import path

from evals import api

urlpatterns = [
    path("sets", api.EvalSetCollectionApi.as_view(), name="eval-set-collection"),
    path("sets/<str:name>", api.EvalSetDetailApi.as_view(), name="eval-set-detail"),
    path("runs", api.EvalRunCollectionApi.as_view(), name="eval-run-collection"),
    path("runs/<str:run_id>", api.EvalRunDetailApi.as_view(), name="eval-run-detail"),
    path("runs/<str:run_id>/cancel", api.EvalRunCancelApi.as_view(), name="eval-run-cancel"),
    path("runs/<str:run_id>/compare/<str:other_id>", api.EvalRunCompareApi.as_view(), name="eval-run-compare"),
]
