"""The demo: the seed's ``sds-company-data`` server bound and discovered, the shipped local tools (``calculate``,
``classify_request`` and its department table) bound as the ``local`` server, the ``company-assistant`` agent
with rules that answer the seed's sample questions (its ``multi_tool`` question included), and an admin user.

Safe to run again (``bin/up`` runs it on every start): a re-run creates only what is missing and leaves what
exists as an admin left it (a server's settings, a tool's contract, the agent's settings, servers and rules, the
request categories), saying what it kept. It used to set them back to the seed's: a tool an admin had marked
``write`` was ``read`` again, its calls no longer waiting for approval."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Collection
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.db.models import QuerySet
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agents.models import Agent, DeterministicRule
from agents.services import agent_create, agent_update, deterministic_rule_create
from audit.management.commands.create_auditor import password_problems, user_problems
from audit.roles import user_create
from mcpregistry.models import McpServer, RequestCategory, ToolContract
from mcpregistry.pool import shutdown_default_pool
from mcpregistry.services import (
    mcp_server_create,
    mcp_server_discover,
    mcp_server_update,
    request_category_create,
    tool_contract_update,
)

DEMO_MCP_ID = "sds-company-data"
DEMO_AGENT = "company-assistant"

SYSTEM_PROMPT = (
    "당신은 삼성SDS 사내 정보 도우미입니다. 직원, 팀, 자산, 프로젝트 질문에 도구로 확인한 사실만으로 답하세요. "
    "도구가 실패하면 그 안내를 따르고, 확인하지 못한 내용은 지어내지 마세요."
)

# A name before 님, a title between them or not ("김하늘 님", "박도윤 팀장님"): the title is no name ("팀장님" alone
# names no one; the rule read "팀장" as the person's name and answered that no such employee exists).
TITLES = "팀장|부장|차장|과장|대리|매니저|선임|책임|수석|프로"
NAME_BEFORE_NIM = r"(?P<{group}>(?!(?:" + TITLES + r")\s*님)[가-힣]{{2,4}})\s*(?:(?:" + TITLES + r")\s*)?님"

DEMO_RULES: list[dict[str, Any]] = [
    {
        "name": "직원 소속 조회",
        "order": 10,
        "tool_name": "search_employee",
        "when": {
            "regex": NAME_BEFORE_NIM.format(group="name"),
            "any_keywords": ["팀", "소속", "부서", "직무", "이메일"],
        },
        "params": {"name": "{match.name}"},
        "answer_template": "{result.name} 님은 {result.team} 소속이며, 직무는 {result.role}입니다 (이메일: {result.email}).",
    },
    {
        "name": "팀 인원 조회",
        "order": 20,
        "tool_name": "list_team_members",
        "when": {"regex": r"(?P<team>[가-힣A-Za-z]+팀)", "any_keywords": ["인원", "몇 명", "명단", "구성원", "멤버"]},
        "params": {"team": "{match.team}"},
        # The names too: 명단, 구성원 and 멤버 ask who is in the team, which the count alone did not answer.
        "answer_template": "{params.team} 인원은 {result.count}명입니다: {result.members.*.name}.",
    },
    {
        "name": "팀 프로젝트 조회",
        "order": 30,
        "tool_name": "list_projects",
        "when": {"regex": r"(?P<team>[가-힣A-Za-z]+팀)", "any_keywords": ["프로젝트"]},
        "params": {"team": "{match.team}"},
        "answer_template": "{params.team}의 진행 중인 프로젝트: {result.*.name}",
    },
    {
        "name": "직원 보유 자산 조회",
        "order": 40,
        "tool_name": "get_asset",
        "when": {"regex": NAME_BEFORE_NIM.format(group="owner"), "any_keywords": ["자산", "노트북", "모니터", "장비"]},
        "params": {"owner": "{match.owner}"},
        "answer_template": "{params.owner} 님의 자산은 {result.count}건입니다: {result.assets.*.model}",
    },
    {
        "name": "자산 상태 조회",
        "order": 50,
        "tool_name": "get_asset_status",
        "when": {"regex": r"(?P<asset_id>A-\d{4})", "any_keywords": ["상태", "사용", "현황"]},
        "params": {"asset_id": "{match.asset_id}"},
        "answer_template": "{result.asset_id}: {result.status} (사용자: {result.owner|없음})",
    },
]

# Seed 001's failure handling as a contract: timeouts retried at once, rate limits with backoff (the seed's 2 s
# then 4 s as ceilings: 1–2 s, then 2–4 s, jittered so that callers hit by one limit do not retry in step), a
# wrong answer shape never retried; the model is pointed at the backup tool.
DEMO_CONTRACTS: dict[str, dict[str, Any]] = {
    "get_asset_status": {
        "returns": {"type": "dict", "required": ["asset_id", "status", "owner"]},
        "retry": {
            "max_attempts": 3,
            "on": ["timeout", "rate_limit", "transport"],
            "backoff_base_s": 2.0,
            "backoff_cap_s": 4.0,
        },
        "timeout_s": 2.0,
        "fallback_tool": "get_asset_status_backup",
        "fallback_policy": "suggest",
    },
    "get_asset_status_backup": {"returns": {"type": "str", "non_empty": True}},
}


LOCAL_MCP_ID = "local"
LOCAL_TOOL_MODULE = "mcpregistry.builtin_tools"

# classify_request's table (seed 001's support-request classifier), as data an admin edits.
DEMO_REQUEST_CATEGORIES: list[dict[str, Any]] = [
    {
        "department": "IT지원팀",
        "order": 10,
        "keywords": ["프린터", "노트북", "모니터", "PC", "네트워크", "와이파이", "비밀번호", "로그인", "고장"],
    },
    {"department": "인사팀", "order": 20, "keywords": ["휴가", "연차", "급여", "채용", "인사", "복리후생"]},
    {"department": "총무팀", "order": 30, "keywords": ["출입", "주차", "택배", "비품", "사무실", "회의실"]},
    {"department": "재무팀", "order": 40, "keywords": ["경비", "정산", "영수증", "법인카드", "예산"]},
]

# The shipped local tools only compute and read: marked ``read`` by their admin (this command).
LOCAL_CONTRACTS: dict[str, dict[str, Any]] = {
    "calculate": {"risk": "read", "timeout_s": 2.0, "returns": {"type": "str", "non_empty": True}},
    "classify_request": {"risk": "read", "timeout_s": 5.0, "returns": {"type": "dict", "required": ["department"]}},
}

# Seed 001's multi_tool question ("'프린터가 고장 났어요' 문의 부서를 분류하고 48건이 12% 늘면 몇 건인지
# 계산해줘.") answered by rules, no model: one rule per local tool.
LOCAL_RULES: list[dict[str, Any]] = [
    {
        "name": "문의 부서 분류",
        "order": 60,
        "tool_name": "classify_request",
        "when": {"regex": "['‘\"“](?P<request>[^'’\"”]+)['’\"”]", "any_keywords": ["분류", "부서", "담당"]},
        "params": {"request": "{match.request}"},
        "answer_template": "'{params.request}' 문의는 {result.department} 담당입니다.",
    },
    {
        "name": "증감 계산",
        "order": 70,
        "tool_name": "calculate",
        "when": {"regex": r"(?P<base>\d+(?:\.\d+)?)\s*건이\s*(?P<pct>\d+(?:\.\d+)?)\s*%\s*늘"},
        "params": {"expression": "{match.base} * (1 + {match.pct} / 100)"},
        "answer_template": "{params.expression} = {result}",
    },
]

# The demo server's settings, not secrets (shown, not masked); its INTERNAL_API_KEY is a secret.
DEMO_PUBLIC_ENV = ["FAILURE_MODE", "FAILURE_TIMEOUT_S"]
SEED_ACTOR = "system:seed_demo"
SEED_VIA = "seed_demo"


def contracts_of(server: McpServer, tools: Collection[str] | None) -> QuerySet[ToolContract]:
    """The contracts of ``server``'s tools named in ``tools`` (None: all of them)."""
    contracts = ToolContract.objects.filter(tool__server=server).select_related("tool__server")
    return contracts if tools is None else contracts.filter(tool__name__in=list(tools))


def apply_demo_contracts(server: McpServer, *, tools: Collection[str] | None = None) -> None:
    """The demo's contracts on top of what discovery pre-filled (each change audited): every tool of the demo
    server only reads, which its admin (this command) confirms by marking it ``read`` — discovery proposes
    ``write`` for every tool, whatever the server claims.

    ``tools``: the tools a discovery has just added, the only contracts that are still discovery's (None: every
    tool, for a binding discovered for the first time). Any other contract is an admin's, left as it is: a
    re-run marked a tool an admin had made ``write`` ``read`` again."""
    for contract in contracts_of(server, tools):
        values = {"risk": ToolContract.Risk.READ, **DEMO_CONTRACTS.get(contract.tool.name, {})}
        tool_contract_update(contract=contract, actor=SEED_ACTOR, via=SEED_VIA, data=values)


def seed_demo_server() -> tuple[McpServer, bool]:
    """The demo server's binding, and whether it was created now. An existing one keeps its settings (an
    admin's), except where its program lives: this installation's interpreter, module and folder, so that the
    demo still starts from a checkout that moved or a virtual environment made again."""
    program = {
        # The platform's own interpreter running the shipped server module.
        "command": sys.executable,
        "args": ["-m", settings.PLATFORM_DEMO_SERVER_MODULE],
        "cwd": str(settings.BASE_DIR),
    }
    server = McpServer.objects.filter(mcp_id=DEMO_MCP_ID).first()
    if server is not None:
        return mcp_server_update(server=server, actor=SEED_ACTOR, via=SEED_VIA, data=program), False
    server = mcp_server_create(
        actor=SEED_ACTOR,
        via=SEED_VIA,
        data={
            "mcp_id": DEMO_MCP_ID,
            "name": "SDS 회사 데이터 (company data, seed 001 demo)",
            "transport": McpServer.Transport.STDIO,
            "env": {"FAILURE_MODE": "none", "INTERNAL_API_KEY": "sk-demo-" + secrets.token_hex(16)},
            "public_env": DEMO_PUBLIC_ENV,
            # The demo server keeps no state between calls: one session per worker, reused across runs.
            "session_scope": McpServer.SessionScope.SHARED,
            **program,
        },
    )
    return server, True


def seed_local_tools() -> McpServer:
    """Bind the shipped local tools as the ``local`` server (no process) with classify_request's table. Returns
    the binding; its tools are listed by ``mcp_server_discover`` like any server's. An existing binding is
    returned as it is, and the table is filled in only with the binding: both are an admin's to change."""
    server = McpServer.objects.filter(mcp_id=LOCAL_MCP_ID).first()
    if server is not None:
        return server
    binding = {
        "mcp_id": LOCAL_MCP_ID,
        "name": "로컬 도구 (local tools: calculate, classify_request)",
        "transport": McpServer.Transport.LOCAL,
        "args": [LOCAL_TOOL_MODULE],
        "session_scope": McpServer.SessionScope.SHARED,
        "timeout_s": 10.0,
    }
    server = mcp_server_create(actor=SEED_ACTOR, via=SEED_VIA, data=binding)
    for row in DEMO_REQUEST_CATEGORIES:
        if not RequestCategory.objects.filter(department=row["department"]).exists():
            request_category_create(actor=SEED_ACTOR, via=SEED_VIA, data=row)
    return server


def apply_local_contracts(server: McpServer, *, tools: Collection[str] | None = None) -> None:
    """The shipped local tools' contracts on top of what discovery pre-filled (each change audited); ``tools`` as
    for ``apply_demo_contracts``."""
    for contract in contracts_of(server, tools):
        values = LOCAL_CONTRACTS.get(contract.tool.name)
        if values:
            tool_contract_update(contract=contract, actor=SEED_ACTOR, via=SEED_VIA, data=values)


NO_MATCH_ANSWER = (
    "이 도우미는 모델 없이 정해진 질문에만 답합니다. 이렇게 물어봐 주세요: "
    "직원 소속 (김하늘 님 팀 알려줘), 팀 인원과 명단 (클라우드운영팀 명단 보여줘), "
    "팀 프로젝트 (물류플랫폼팀 프로젝트 알려줘), 직원의 자산 (박도윤 님 자산 알려줘), "
    "자산 상태 (A-1004 상태 알려줘), 문의 부서 ('프린터가 고장 났어요' 문의 부서 분류해줘), "
    "증감 계산 (48건이 12% 늘면 몇 건인지 계산해줘)."
)


def seed_demo_rules(agent: Agent, servers: list[McpServer]) -> int:
    """Add the demo's rules for ``servers`` (the demo server's, the local tools') to ``agent``, each that it has
    no rule of the name of; returns how many were added."""
    rules_by_server = {DEMO_MCP_ID: DEMO_RULES, LOCAL_MCP_ID: LOCAL_RULES}
    added = 0
    for server in servers:
        for rule in rules_by_server.get(server.mcp_id, []):
            if DeterministicRule.objects.filter(agent=agent, name=rule["name"]).exists():
                continue
            deterministic_rule_create(actor=SEED_ACTOR, via=SEED_VIA, data={"agent": agent, **rule, "server": server})
            added += 1
    return added


ADMIN_PASSWORD_PREFIX = "admin password:"  # noqa: S105 (a line prefix bin/up reads, not a password)


def demo_password_problems(password: str, *, user: Any) -> None:
    """Refuse a ``DEMO_ADMIN_PASSWORD`` that Django's password validators (``AUTH_PASSWORD_VALIDATORS``) or the
    login form would refuse, naming the variable. Raises CommandError."""
    try:
        password_problems(password)
    except CommandError as exc:
        raise CommandError(_("DEMO_ADMIN_PASSWORD is refused: %(problems)s") % {"problems": exc}) from None
    try:
        validate_password(password, user=user)
    except ValidationError as exc:
        raise CommandError(
            _("DEMO_ADMIN_PASSWORD is refused: %(problems)s") % {"problems": " ".join(exc.messages)}
        ) from None


class Command(BaseCommand):
    help = gettext_noop(
        "Bind and discover the demo MCP server, create the company-assistant agent with its rules, and an admin."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument("--admin-username", default=settings.PLATFORM_DEMO_ADMIN_USERNAME)
        parser.add_argument("--no-discover", action="store_true", help=_("bind the server but do not start it"))

    def handle(self, *args: Any, **options: Any) -> None:
        # An admin name Django would refuse (empty, spaces, over 150 characters: user_create does not check) stops
        # the seed before anything of it is written or reported.
        user_model = get_user_model()
        admin = user_model(username=user_model.normalize_username(options["admin_username"]))
        user_problems(admin)
        if settings.PLATFORM_DEMO_ADMIN_PASSWORD and not user_model.objects.filter(username=admin.username).exists():
            # DEMO_ADMIN_PASSWORD is taken as given only if the admin's password page would take it: "admin" or
            # "12345678" made a superuser on a server anyone might reach.
            demo_password_problems(settings.PLATFORM_DEMO_ADMIN_PASSWORD, user=admin)
        with transaction.atomic():
            server, server_created = seed_demo_server()
            local_created = not McpServer.objects.filter(mcp_id=LOCAL_MCP_ID).exists()
            local = seed_local_tools()
            if not server_created:
                self.stdout.write(
                    _("kept MCP server %(server)s and its settings as they are") % {"server": DEMO_MCP_ID}
                )
            if not local_created:
                self.stdout.write(
                    _("kept %(server)s and the request categories as they are") % {"server": LOCAL_MCP_ID}
                )
            new_servers = [s for s, created in ((server, server_created), (local, local_created)) if created]
            self._agent(server=server, local=local, new_servers=new_servers, server_created=server_created)
            self._admin(options["admin_username"])
        # The local tools start no process: listed even with --no-discover.
        local_report = mcp_server_discover(server=local, actor=SEED_ACTOR, via=SEED_VIA)
        if not local_report.ok:
            raise CommandError(
                _("discovery of %(server)s failed: %(error)s") % {"server": LOCAL_MCP_ID, "error": local_report.error}
            )
        apply_local_contracts(local, tools=local_report.added)
        self.stdout.write(
            _("%(server)s: %(count)s local tools listed") % {"server": LOCAL_MCP_ID, "count": local_report.tool_count}
        )
        self._contracts_kept(local, added=local_report.added)
        if options["no_discover"]:
            return
        self.stdout.write(_("discovering %(server)s (starts the server once)…") % {"server": DEMO_MCP_ID})
        try:
            report = mcp_server_discover(server=server, actor=SEED_ACTOR, via=SEED_VIA)
        finally:
            shutdown_default_pool()
        if not report.ok:
            raise CommandError(
                _("discovery of %(server)s failed: %(error)s") % {"server": DEMO_MCP_ID, "error": report.error}
            )
        apply_demo_contracts(server, tools=report.added)
        self._contracts_kept(server, added=report.added)
        self.stdout.write(
            self.style.SUCCESS(
                _("%(server)s: %(count)s tools discovered") % {"server": DEMO_MCP_ID, "count": report.tool_count}
            )
        )

    def _agent(
        self, *, server: McpServer, local: McpServer, new_servers: list[McpServer], server_created: bool
    ) -> None:
        """The demo agent: created with both servers and the demo's rules where it is missing; an existing one
        keeps its settings, servers and rules (an admin's), and is given only the servers created now (the
        seed's, missing before: a platform seeded before the local tools shipped) with their rules."""
        agent = Agent.objects.filter(slug=DEMO_AGENT).first()
        if agent is None:
            agent_values = {
                "name": "회사 정보 도우미 (company assistant)",
                "system_prompt": SYSTEM_PROMPT,
                "model_provider": Agent.Provider.OFFLINE,
                "max_iterations": 6,
                # What the offline demo answers, where no rule matched (the generic text said only "ask otherwise").
                "no_match_answer": NO_MATCH_ANSWER,
            }
            agent = agent_create(
                actor=SEED_ACTOR, via=SEED_VIA, data={"slug": DEMO_AGENT, **agent_values}, servers=[server, local]
            )
            seeded = {"server": DEMO_MCP_ID, "agent": DEMO_AGENT, "count": seed_demo_rules(agent, [server, local])}
            if server_created:
                self.stdout.write(_("bound MCP server %(server)s; agent %(agent)s with %(count)s rules") % seeded)
            else:
                self.stdout.write(_("created agent %(agent)s with %(count)s rules") % seeded)
            return
        if new_servers:
            agent_update(agent=agent, actor=SEED_ACTOR, via=SEED_VIA, servers=[*agent.servers.all(), *new_servers])
            added = seed_demo_rules(agent, new_servers)
            self.stdout.write(
                _(
                    "bound %(servers)s to agent %(agent)s with %(count)s rules; kept its settings and its other "
                    "servers and rules as they are"
                )
                % {"servers": ", ".join(s.mcp_id for s in new_servers), "agent": DEMO_AGENT, "count": added}
            )
            return
        self.stdout.write(
            _("kept agent %(agent)s with its settings, servers and rules as they are") % {"agent": DEMO_AGENT}
        )

    def _contracts_kept(self, server: McpServer, *, added: list[str]) -> None:
        """Say how many of ``server``'s contracts a re-run left as they are (none on a first discovery)."""
        kept = ToolContract.objects.filter(tool__server=server).exclude(tool__name__in=added).count()
        if kept:
            self.stdout.write(
                _("%(server)s: kept the contracts of %(count)s tools as they are")
                % {"server": server.mcp_id, "count": kept}
            )

    def _admin(self, username: str) -> None:
        user_model = get_user_model()
        username = user_model.normalize_username(username)  # as Django's login form composes what is typed
        if user_model.objects.filter(username=username).exists():
            self.stdout.write(_("admin user '%(username)s' exists (password unchanged)") % {"username": username})
            return
        password = settings.PLATFORM_DEMO_ADMIN_PASSWORD or secrets.token_urlsafe(12)
        user_create(
            actor=SEED_ACTOR,
            via=SEED_VIA,
            username=username,
            password=password,
            is_staff=True,
            is_superuser=True,
        )
        self.stdout.write(_("admin user: %(username)s") % {"username": username})
        # Not translated: bin/up reads this line by its prefix (to show the password once and keep it out of
        # var/seed_demo.log), whatever LANGUAGE_CODE is.
        self.stdout.write(f"{ADMIN_PASSWORD_PREFIX} {password}")
