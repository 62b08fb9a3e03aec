"""The WebSocket endpoint (`/ws/echo/`): greets the signed-in user by name (the session cookie
reached it) or "visitor", then echoes every text and binary message; "bye" makes it close with
code 4000. Each connection is written to `requests.log` as `WEBSOCKET /ws/echo/`, as the
middleware writes each page request."""
from channels.generic.websocket import WebsocketConsumer
from django.conf import settings


class Echo(WebsocketConsumer):
    def connect(self):
        with open(settings.DATA_DIR / "requests.log", "a") as log:
            log.write(f"WEBSOCKET {self.scope['path']}\n")
        self.accept()
        user = self.scope["user"]
        self.send(text_data=f"Hello, {user.first_name if user.is_authenticated else 'visitor'}")

    def receive(self, text_data=None, bytes_data=None):
        if text_data == "bye":
            self.close(code=4000)
        elif text_data is not None:
            self.send(text_data=text_data)
        else:
            self.send(bytes_data=bytes_data)
