"""Django's own admin texts where its Korean catalogue reads badly: the platform's catalogue (``locale/``, first in
Django's search) translates them again. Listed here so that ``makemessages`` keeps them; nothing imports this.

- "View %s" is "뷰 %s" in Django's catalogue: a read-only object's page title reads "뷰 실행" ("view" as in
  a screen), not "실행 보기".
- "Select %s to view" is "보기위한 %s 선택" (``tests/test_locale.py`` checks it).
"""

from django.utils.translation import gettext_noop

OVERRIDDEN = (
    gettext_noop("View %s"),
    gettext_noop("Select %s to view"),
)
