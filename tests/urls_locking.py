"""URLs of the lock_view test views (included under /locking/ by tests/urls.py)."""

from django.urls import path

from tests import views_locking as views

urlpatterns = [
    path("gated/<str:name>/", views.gated),
    path("agated/<str:name>/", views.agated),
    path("await/<str:name>/", views.await_lock),
    path("ping/", views.ping),
    path("key/<path:value>/", views.key),
    path("user/<slug:slug>/", views.per_user),
    path("auser/<slug:slug>/", views.aper_user),
    path("callable/<str:name>/", views.by_callable),
    path("boom/<str:name>/", views.boom),
    path("aboom/<str:name>/", views.aboom),
    path("stream/<str:name>/", views.stream),
    path("astream/<str:name>/", views.astream),
    path("conflict/<str:name>/", views.conflict),
    path("nothing/<str:name>/", views.nothing),  # type: ignore[arg-type]
    path("anothing/<str:name>/", views.anothing),  # type: ignore[arg-type]
    path("early/<str:name>/", views.early),
    path("aearly/<str:name>/", views.aearly),
    path("etag/<str:name>/", views.etag_stream),  # type: ignore[arg-type]
    path("aetag/<str:name>/", views.aetag_stream),  # type: ignore[arg-type]
    path("template/<str:name>/", views.templated),
    path("templates/<str:name>/", views.templated_list),
    path("custom/<str:name>/", views.custom),
    path("cbv/mixin/<int:pk>/", views.MixinView.as_view()),
    path("cbv/amixin/<int:pk>/", views.AsyncMixinView.as_view()),
    path("cbv/decorated/<int:pk>/", views.DecoratedView.as_view()),
    path("cbv/adecorated/<int:pk>/", views.AsyncDecoratedView.as_view()),
    path("cbv/auser/<slug:slug>/", views.AsyncUserMixinView.as_view()),
    path("bump/decorated/<int:pk>/", views.bump),
    path("bump/mixin/<int:pk>/", views.BumpMixinView.as_view()),
    path("bump/past-ttl/<int:pk>/", views.bump_past_ttl),
]
