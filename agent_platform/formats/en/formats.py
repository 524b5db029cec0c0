"""Dates as the platform's own pages write them (run trace, approvals, audit): one form in every list and page,
in every language, sortable and unambiguous for an auditor. Django's own forms for the language otherwise
(``2026년 12월 4일 12:30 오전``, ``Dec. 4, 2026, 12:30 a.m.``)."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
