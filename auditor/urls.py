"""The auditors' API, mounted under ``/api/v1/audit/``."""

from django.urls import path

from auditor import api

urlpatterns = [
    path("events", api.AuditEventListApi.as_view(), name="audit-event-list"),
    path("metrics", api.AuditMetricsApi.as_view(), name="audit-metrics"),
]
