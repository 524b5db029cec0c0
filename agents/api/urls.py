from django.urls import path

from agents.api import views

urlpatterns = [
    path("runs", views.RunCreateApi.as_view(), name="run-create"),
    path("runs/<str:run_id>", views.RunDetailApi.as_view(), name="run-detail"),
    path(
        "runs/<str:run_id>/approvals/<str:approval_id>",
        views.RunApprovalDecideApi.as_view(),
        name="run-approval-decide",
    ),
]
