from . import argparse_text
from .celery import app as celery_app

# argparse's own messages in the platform's language (agent_platform/argparse_text.py): this package is imported
# at every Django start (its settings module), and agent_platform is no installed app with a ready() to do it.
argparse_text.install()

__all__ = ("celery_app",)
