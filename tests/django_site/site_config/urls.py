from django.urls import path, re_path

from shop import views

urlpatterns = [
    path("", views.home),
    path("articles/<int:number>/", views.article),
    path("echo/", views.echo),
    path("account/", views.account),
    path("login/", views.login_view),
    path("logout/", views.logout_view),
    path("comment/", views.comment),
    # served by the app itself (no separate web server in the suite), with a long lifetime
    re_path(r"^static/(?P<path>.*)$", views.static_file),
]
