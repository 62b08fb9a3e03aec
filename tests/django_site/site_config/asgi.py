"""The site as an ASGI application, for uvicorn: its WebSocket endpoint (Django Channels), and
its pages too, though in the suite gunicorn serves those and Lacquer sends only `/ws/` here
(the `backend_group` rule of lacquer.toml), as Channels' deployment docs split the two."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_config.settings")
# first: sets Django up, which the imports below need
pages = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from shop.consumers import Echo  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": pages,
        # the session cookie gives the socket its user, as it gives a page
        "websocket": AuthMiddlewareStack(URLRouter([path("ws/echo/", Echo.as_asgi())])),
    }
)
