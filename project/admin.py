"""Admin of the demo project: fenced accounts (read the fence) and versioned articles."""

from __future__ import annotations

from django.contrib import admin

from locks.versioning_admin import VersionedModelAdmin

from .models import Account, Article


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Accounts; ``fence`` shows the fencing token of the latest fenced write."""

    list_display = ["name", "balance", "fence"]
    readonly_fields = ["fence"]


@admin.register(Article)
class ArticleAdmin(VersionedModelAdmin):
    """Articles; an edit based on an old version is refused instead of overwriting."""

    list_display = ["title", "version"]
