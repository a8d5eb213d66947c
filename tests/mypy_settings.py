"""Settings for the type checker: the package alone, no demo or test apps.

``mypy`` (``[tool.mypy]`` in pyproject.toml) loads them through django-stubs' plugin to learn
the models; nothing here touches a database.
"""

SECRET_KEY = "mypy"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_taskloop",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True
