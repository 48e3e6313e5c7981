"""System checks of the locks app (``manage.py check``)."""

from __future__ import annotations

from typing import Any, cast

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import connections

from .conf import DEFAULTS, VALID, conf


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """locks.E001/E002/E004/E005, locks.W001: the ``LOCKS`` setting and what it points at."""
    errors: list[CheckMessage] = []
    user = getattr(settings, "LOCKS", None)
    if user is None:
        user = {}  # as the app reads it: LOCKS = None is LOCKS unset
    if not isinstance(user, dict):
        return [Error("LOCKS must be a dict.", hint=f"Got {user!r}.", id="locks.E001")]
    # Keys need not be strings (LOCKS = {1: 2}): name each as written, sort the names.
    unknown = sorted(
        key if isinstance(key, str) else repr(key) for key in user if key not in DEFAULTS
    )
    if unknown:
        errors.append(
            Error(
                f"Unknown LOCKS keys: {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="locks.E001",
            )
        )
    for key in ("NOTIFY", "PREPARED_STATEMENTS"):
        try:
            conf.tri_state(key)
        except TypeError as exc:
            errors.append(
                Error(
                    f"{exc}.",
                    hint="None means on, unless the database is reached through a "
                    "transaction pooler (DISABLE_SERVER_SIDE_CURSORS).",
                    id="locks.E004",
                )
            )
    errors.extend(_bad_values())
    try:
        _ = conf.DATABASE  # the rule the app applies where it reads the setting
    except (TypeError, ValueError):
        errors.append(
            Error(
                f"LOCKS['DATABASE'] is {conf.raw('DATABASE')!r}, which is not in DATABASES.",
                hint=f"Use one of: {', '.join(sorted(connections.settings))}.",
                id="locks.E002",
            )
        )
    if not settings.USE_TZ:
        errors.append(
            Warning(
                "USE_TZ is False: lock times are kept in UTC and will read as local times.",
                hint="Set USE_TZ = True (Django's default).",
                id="locks.W001",
            )
        )
    return errors


def _bad_values() -> list[CheckMessage]:
    """locks.E005: each numeric setting outside its range, read as the app reads it."""
    errors: list[CheckMessage] = []
    bad: set[str] = set()
    for key, valid in VALID.items():
        try:
            getattr(conf, key)
        except (TypeError, ValueError) as exc:
            bad.add(key)
            errors.append(Error(f"{exc}.", hint=f"Use {valid}.", id="locks.E005"))
    # Their order is worth a word only once each is valid on its own.
    if not bad & {"BACKOFF_MIN", "BACKOFF_MAX"}:
        try:
            conf.backoff()
        except ValueError as exc:
            hint = "The pauses of a blocking acquire grow from BACKOFF_MIN up to BACKOFF_MAX."
            errors.append(Error(f"{exc}.", hint=hint, id="locks.E005"))
    return errors


def _version_problem(connection: Any) -> str | None:
    vendor = connection.vendor
    if vendor not in {"postgresql", "mysql", "sqlite"}:
        # Before asking the version: other backends need not implement that.
        return f"{vendor} is not supported; use PostgreSQL, MariaDB or SQLite"
    version = connection.get_database_version()
    if vendor == "postgresql" and version < (13,):
        return f"PostgreSQL {version} is too old; 13 or newer is needed"
    if vendor == "mysql":
        if not connection.mysql_is_mariadb:
            return "MySQL lacks SEQUENCE and RETURNING; use MariaDB 10.6+"
        if version < (10, 6):
            return f"MariaDB {version} is too old; 10.6 or newer is needed"
    if vendor == "sqlite" and version < (3, 35):
        return f"SQLite {version} is too old; 3.35 or newer is needed"
    return None


def _innodb_flush(connection: Any) -> int:
    # A server-wide setting: the app's connections cannot choose it per session as they do
    # synchronous_commit (PostgreSQL) and PRAGMA synchronous (SQLite).
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@GLOBAL.innodb_flush_log_at_trx_commit")
        return int(cursor.fetchone()[0])


@register(Tags.models)
def check_versioned_managers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """locks.E006, E007: a VersionedModel whose rows some update leaves at their version.

    E006: the default manager's ``update()`` (a custom ``objects``, or a parent's under
    multi-table inheritance), or the base manager's where ``on_delete=SET_NULL`` or
    ``SET(value)`` updates rows through it. E007: ``on_delete=SET_DEFAULT`` or
    ``SET(callable)``, which Django writes past every manager. Either way a copy loaded
    before the update then saves over it unnoticed.
    """
    from django.apps import apps

    from .versioning import VersionedModel, VersionedQuerySet

    models = (
        apps.get_models()
        if app_configs is None
        else [model for config in app_configs for model in config.get_models()]
    )
    errors: list[CheckMessage] = []
    for model in models:
        if not issubclass(model, VersionedModel):
            continue
        queryset = model._default_manager.get_queryset()
        if not isinstance(queryset, VersionedQuerySet):
            errors.append(
                Error(
                    f"{model._meta.label}'s default manager "
                    f"({model._default_manager.name}) makes a {type(queryset).__name__}: "
                    "its update() would not increment the version.",
                    hint="Build the manager on locks.versioning.VersionedQuerySet, e.g. "
                    "objects = VersionedQuerySet.as_manager(), or "
                    "MyQuerySet(VersionedQuerySet).",
                    obj=model,
                    id="locks.E006",
                )
            )
        errors.extend(_versioned_on_delete(model, VersionedQuerySet))
    return errors


def _versioned_on_delete(model: Any, versioned: type[Any]) -> list[CheckMessage]:
    """locks.E006, E007 for the foreign keys of ``model`` that deleting their target updates."""
    from django.db.models import SET_DEFAULT, SET_NULL

    from .versioning import VersionedModel

    errors: list[CheckMessage] = []
    if model._meta.proxy:
        return errors  # its fields and rows are its concrete model's, checked there
    for field in model._meta.fields:
        on_delete = getattr(field.remote_field, "on_delete", None)
        deconstruct = getattr(on_delete, "deconstruct", None)
        is_set = deconstruct is not None and deconstruct()[0] == "django.db.models.SET"
        if on_delete not in (SET_NULL, SET_DEFAULT) and not is_set:
            continue
        handler = "SET(...)" if is_set else getattr(on_delete, "__name__", "")
        target = field.remote_field.model._meta.label
        owner = field.model
        if owner._meta.concrete_model is not model._meta.concrete_model:
            # A concrete parent's column, updated through the parent's managers: a
            # versioned parent is checked on its own; any other leaves the version be.
            if not issubclass(owner, VersionedModel):
                errors.append(
                    Error(
                        f"{model._meta.label}.{field.name} has on_delete={handler}: "
                        f"deleting a {target} updates that column on the table of "
                        f"{owner._meta.label}, which is not versioned, without "
                        f"incrementing {model._meta.label}'s version.",
                        hint=f"Make {owner._meta.label} the VersionedModel, or use "
                        "on_delete=CASCADE or PROTECT.",
                        obj=field,
                        id="locks.E007",
                    )
                )
            continue
        # The lazy ones update through the base manager's update(); the others have the
        # rows loaded first and write them with a query of Django's own.
        if not getattr(on_delete, "lazy_sub_objs", False):
            errors.append(
                Error(
                    f"{model._meta.label}.{field.name} has on_delete={handler}: deleting a "
                    f"{target} updates the rows pointing at it without incrementing their "
                    "version (Django writes them past every manager).",
                    hint="Use on_delete=models.SET_NULL or models.SET(<a constant value>), "
                    "whose update goes through the base manager and increments the version; "
                    "or CASCADE or PROTECT.",
                    obj=field,
                    id="locks.E007",
                )
            )
            continue
        manager = model._base_manager
        queryset = manager.get_queryset()
        if not isinstance(queryset, versioned):
            errors.append(
                Error(
                    f"{model._meta.label}.{field.name} has on_delete={handler}: deleting a "
                    f"{target} updates the rows pointing at it through the base manager "
                    f"({manager.name}), whose {type(queryset).__name__} would not "
                    "increment the version.",
                    hint="Name a manager built on locks.versioning.VersionedQuerySet that "
                    "leaves no row out in Meta.base_manager_name (e.g. rows = "
                    'VersionedQuerySet.as_manager(), base_manager_name = "rows"). Without '
                    "one, the default manager is taken when it is a VersionedQuerySet "
                    "manager that does not override get_queryset().",
                    obj=field,
                    id="locks.E006",
                )
            )
    return errors


@register(Tags.database)
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """locks.E003, W002, W003: the locks database's server (needs ``check --database``)."""
    try:
        alias = conf.DATABASE
    except (TypeError, ValueError):
        return []  # a bad LOCKS or LOCKS['DATABASE']: check_settings reports it
    if not databases or alias not in databases:
        return []
    connection = connections[alias]
    errors: list[CheckMessage] = []
    problem = _version_problem(connection)
    if problem:
        errors.append(Error(f"Database {alias!r}: {problem}.", id="locks.E003"))
    if connection.vendor == "mysql" and not problem:
        flush = _innodb_flush(connection)
        if flush != 1:
            errors.append(
                Warning(
                    f"Database {alias!r}: innodb_flush_log_at_trx_commit is {flush}, so a "
                    "crash of the server or its machine can take back a lock it granted, and "
                    "the next holder would get the same fencing token.",
                    hint="SET GLOBAL innodb_flush_log_at_trx_commit = 1 (MariaDB's default), "
                    "and in the server's configuration.",
                    id="locks.W003",
                )
            )
    if (
        connection.vendor == "sqlite"
        and cast(Any, connection).is_in_memory_db()
        # Django's own in-memory test database (manage.py test of a project on a SQLite
        # file runs the checks on it), not the project's configuration.
        and connection.settings_dict["NAME"] != cast(Any, connection.creation)._get_test_db_name()
    ):
        errors.append(
            Warning(
                f"Database {alias!r} is an in-memory SQLite database: locks held there are "
                "invisible to other processes.",
                hint="Use a SQLite file, or a server database.",
                id="locks.W002",
            )
        )
    return errors
