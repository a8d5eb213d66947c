"""Settings of the demo project. ``DATABASE_URL`` picks the database (default: a SQLite file).

DATABASE_URL=mysql://root@127.0.0.1:3306/test
DATABASE_URL=postgres:///test
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SECRET_KEY", "demo-only-not-secret")
DEBUG = os.environ.get("DEBUG", "1") == "1"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rangefilter",
    "django_taskloop",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]


def database_from_url(url: str) -> dict:
    """Parse ``url`` into a DATABASES entry with the options each vendor wants."""
    import dj_database_url

    config = dj_database_url.parse(url)
    engine = config["ENGINE"]
    if "mysql" in engine:
        config.setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
    if "sqlite" in engine:
        config.setdefault("OPTIONS", {}).update({"timeout": 20})
    return config


DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": database_from_url(DATABASE_URL)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "demo.sqlite3",
            "OPTIONS": {"timeout": 20},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
LOGIN_URL = "admin:login"

TASKLOOP = {}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_taskloop": {"handlers": ["console"], "level": os.environ.get("TASKLOOP_LOG", "INFO")}
    },
}

# Django Tasks (Django 6's django.tasks; on Django 5.2 the django-tasks backport app): tasks
# wait in tubes named "tasks.<queue>" and run in `manage.py workers`.
try:
    import django.tasks  # noqa: F401
except ImportError:
    try:
        import django_tasks  # noqa: F401
    except ImportError:
        pass
    else:
        INSTALLED_APPS.append("django_tasks")
TASKS = {
    "default": {
        "BACKEND": "django_taskloop.backends.TaskloopBackend",
        "QUEUES": ["default", "slow"],
    }
}
