"""The test site's pages. Every page says the app is happy to be cached for a minute
(`max-age=60`), logged-in pages included: keeping those out of a shared cache is the job of
Lacquer's rules, which is what the suite checks."""
from django.contrib.auth import authenticate, login, logout
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_http_methods
from django.views.static import serve
from django.conf import settings


def cacheable(response, seconds=60):
    response["Cache-Control"] = f"max-age={seconds}"
    return response


def home(request):
    # reads request.user, so the session is looked at (Django adds Vary: Cookie)
    return cacheable(render(request, "home.html"))


def echo(request):
    # the page that opens the WebSocket: the same for every visitor
    return cacheable(render(request, "echo.html"))


def article(request, number):
    return cacheable(render(request, "article.html", {"number": number}))


@login_required
def account(request):
    return cacheable(render(request, "account.html"))


@require_http_methods(["GET", "POST"])
def login_view(request):
    error = None
    if request.method == "POST":
        user = authenticate(
            request,
            username=request.POST.get("username", ""),
            password=request.POST.get("password", ""),
        )
        if user is not None:
            login(request, user)
            return HttpResponseRedirect("/account/")
        error = "wrong name or password"
    return render(request, "login.html", {"error": error})


def logout_view(request):
    logout(request)
    return HttpResponseRedirect("/")


@login_required
@require_http_methods(["GET", "POST"])
def comment(request):
    if request.method == "POST":
        text = request.POST.get("text", "")
        request.session.setdefault("comments", []).append(text)
        request.session.modified = True
    return render(request, "comment.html", {"comments": request.session.get("comments", [])})


def static_file(request, path):
    return cacheable(serve(request, path, document_root=settings.STATIC_ROOT), 3600)
