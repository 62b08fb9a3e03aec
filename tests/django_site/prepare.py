"""Creates the test site's database and its two users: run before gunicorn starts."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_config.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402

os.makedirs(settings.DATA_DIR, exist_ok=True)
call_command("migrate", verbosity=0, interactive=False)
for name, password in [("alice", "wonderland"), ("bob", "builder")]:
    if not User.objects.filter(username=name).exists():
        User.objects.create_user(name, password=password, first_name=name.capitalize())
print("prepared", settings.DATABASES["default"]["NAME"])
