"""Counts the requests that reach the app: one line per request in
`$DJANGO_DATA_DIR/requests.log`, written before the response leaves, so a test that has its
response can count it (gunicorn's access log is written after)."""
from django.conf import settings


class RequestLog:
    def __init__(self, get_response):
        self.get_response = get_response
        self.path = settings.DATA_DIR / "requests.log"

    def __call__(self, request):
        with open(self.path, "a") as log:
            log.write(f"{request.method} {request.get_full_path()}\n")
        return self.get_response(request)
