"""URLs of the demo page (under /demo/)."""

from django.urls import path

from project import views

app_name = "demo"
urlpatterns = [
    path("", views.index, name="index"),
    path("report/", views.report, name="report"),
    path("enqueue/", views.enqueue, name="enqueue"),
    path("locks.json", views.lock_table, name="locks"),
]
