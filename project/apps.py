"""App config of the demo project, so it can ship management commands and tasks."""

from django.apps import AppConfig


class ProjectConfig(AppConfig):
    """The demo project as an app: `manage.py contention_demo` lives in it."""

    name = "project"
    verbose_name = "Locks demo"
