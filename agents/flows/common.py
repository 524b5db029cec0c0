"""What the flow templates share: the state, reading names and teams out of a Korean question, and the answers for
a call that brought nothing to answer from."""

from __future__ import annotations

import re
from typing import Any, TypedDict

from django.conf import settings as django_settings

from agent_platform.json import loads as json_loads
from agents.answers import TOOL_OWN_ERRORS, all_calls_failed_text
from agents.tools import ToolFailure
from mcpregistry.gate import reports_error

TEAM = re.compile(r"([가-힣A-Za-z]+팀)")
WORD = re.compile(r"[가-힣A-Za-z0-9]+")
HANGUL_NAME = re.compile(r"[가-힣]{2,4}")
# What follows a name in a question: a particle, an honorific, a title ("김하늘의", "김하늘한테", "박도윤 팀장님은"),
# the copula ("김하늘이야", "나 김하늘인데"). The particles of two syllables or more and 의 are always taken off; one
# of one syllable only where three are left: "정하은" (은), "김영이" (이), "박도" are names.
HONORIFIC = "님"
TITLES = ("팀장", "팀원", "매니저", "부장", "차장", "과장", "대리", "사원", "선임", "책임", "수석", "프로", "씨")
LONG_PARTICLES = ("에게서", "에게", "한테", "께서", "이랑", "에서", "보다", "처럼", "이에요", "입니다", "이야", "인데")
PARTICLES = ("은", "는", "이", "가", "을", "를", "에", "와", "과", "랑", "도", "만")
# The words of the questions these templates answer, question words, words of time and manner, the modifiers a
# question puts before a noun ("노트북 가진 사람") and a request's endings ("알려줘", "있어?"): no one's name; nor
# is a word with 팀 in it (a team, "팀장").
NOT_NAMES = frozenset({"프로젝트", "자산", "노트북", "모니터", "인원", "인원수", "명단", "소속", "직원", "정보",
                       "목록", "전체", "우리", "저희", "사람", "담당자", "현황", "오늘", "어제", "내일", "지금",
                       "혹시", "그럼", "그리고", "요즘", "최근", "이번", "지난", "다음", "현재", "새로", "모든",
                       "같은", "가진", "있는", "없는", "맡은", "쓰는", "입사한", "관련", "대해", "대한", "진행", "중인",
                       "담당", "관리", "문의", "올해", "작년", "내년", "신규", "회사", "가능한",
                       "구성원", "멤버", "장비", "기기", "서버", "랩탑"})  # fmt: skip
# ``TEAM`` reads a name written together with its title ("김하늘팀장님", "박도윤팀원") as a team ("김하늘팀"), and
# so it is read (``team_in``): "백엔드팀장", "신제품팀원" are a team's lead and members, though their words begin as
# a family name does. Only an honorific after the title ("김하늘팀장님") makes a full name of three syllables whose
# first is a common family name and that reads as a name (``_glued_name``) a person's: where there is no team of
# that name, a template reads the rest as the person (``glued_person``: "박도윤팀장 팀원 몇 명이야?"). The teams of
# three syllables that begin with a family name ("서비스팀") are teams even so. A given name alone ("하늘팀장님")
# reads as a team.
GLUED_TITLES = ("팀장", "팀원")
FAMILY_NAMES = frozenset(
    "김이박최정강조윤장임한오서신권황안송전홍유고문양손배백허남심노하곽성차주우구민류나진지엄채원천방공"
)
TEAM_STEMS = frozenset({"서비스", "신사업", "차세대", "정보화", "공급망"})
# A word before one of these is what the question is about: "오늘 김하늘 자산" asks about 김하늘, not 오늘.
TOPIC_WORDS = frozenset(
    {"프로젝트", "자산", "노트북", "모니터", "장비", "기기", "서버", "랩탑", "GPU", "소속", "정보", "팀"}
)
# Question words and their particle forms ("누가", "누구가", "무슨", "어떻게", "언제", "왜"): no name begins so.
QUESTION_WORDS = ("몇", "누구", "누가", "어디", "어느", "어떤", "어떻", "무엇", "무슨", "뭐", "언제", "왜", "얼마")
REQUEST_ENDINGS = ("줘", "요", "야", "까", "어", "죠")
# The plural suffix: "사람들", "직원들" are no more a name than "사람", "직원".
PLURAL = "들"
# The kinds of asset a question may name, each with the asset type it stands for ("랩탑" is a 노트북), found as a part
# of a type's name ("서버" and "GPU" of "GPU 서버"), in any case ("gpu"); and the words that ask for assets of any
# kind ("자산", "장비", "기기").
ASSET_KINDS = {"노트북": "노트북", "랩탑": "노트북", "모니터": "모니터", "서버": "서버", "gpu": "gpu"}
ASSET_WORDS = re.compile("|".join(("자산", "장비", "기기", *ASSET_KINDS)), re.IGNORECASE)
ASSET_KIND = re.compile("|".join(ASSET_KINDS), re.IGNORECASE)
# Kinds that qualify the kind written after them, one name with it ("GPU 서버"); any other two kinds written side by
# side are two ("노트북 모니터").
ASSET_QUALIFIERS = frozenset({"gpu"})


def default_mcp_id() -> str:
    """The server a flow template calls unless the agent's flow options name one (``{"mcp_id": ...}``):
    ``settings.PLATFORM_FLOW_DEFAULT_MCP_ID``."""
    return str(django_settings.PLATFORM_FLOW_DEFAULT_MCP_ID)


class FlowState(TypedDict, total=False):
    query: str
    context: dict[str, Any]
    a2a_data: list[dict[str, Any]]
    messages: list[Any]
    employee: Any
    team: str
    assets: Any
    projects: Any
    members: Any
    request: dict[str, Any]
    response: dict[str, Any]
    output: Any


def _name_stem(word: str) -> tuple[str, bool]:
    """``word`` less the particle, honorific and title that follow a name, and whether it had any ("김하늘의",
    "김하늘님", "김하늘팀장님" are "김하늘", marked; "팀장님은" is "", marked)."""
    if word.startswith(HONORIFIC) and word[1:] in ("", "의", *PARTICLES, *LONG_PARTICLES):
        return "", True  # "이서준 님이": the honorific, a particle after it, marks the word before
    stem = word
    long = next((p for p in LONG_PARTICLES if stem.endswith(p) and len(stem) > len(p) + 1), None)
    if long is not None:
        stem = stem[: -len(long)]
    elif stem.endswith("의") or (stem.endswith(PARTICLES) and len(stem) > 3):
        stem = stem[:-1]
    stem = stem.removesuffix(HONORIFIC)
    for title in TITLES:
        if stem.endswith(title):
            stem = stem[: -len(title)].removesuffix(HONORIFIC)
            break
    return stem, stem != word


def _could_be_a_name(stem: str) -> bool:
    bare = stem[:-1] if stem.endswith(PARTICLES) else stem  # "자산을": a particle after two syllables
    return (
        HANGUL_NAME.fullmatch(stem) is not None
        and "팀" not in stem
        and not {stem, bare, stem.removesuffix(PLURAL)} & NOT_NAMES
        and not stem.startswith(QUESTION_WORDS)
        and not stem.endswith(REQUEST_ENDINGS)
    )


def _glued_name(stem: str) -> bool:
    """Whether ``stem``, the word before a title written together with it ("김하늘" of "김하늘팀장"), is a person's
    name (``GLUED_TITLES``), not a team's ("클라우드운영" of "클라우드운영팀장")."""
    return len(stem) == 3 and stem[0] in FAMILY_NAMES and stem not in TEAM_STEMS and _could_be_a_name(stem)


def name_in(query: str) -> str | None:
    """The person a question is about: a word followed by a particle, an honorific or a title ("김하늘의 노트북",
    "김하늘 팀장님 노트북", "김하늘님"), else a word before what is asked about ("오늘 김하늘 자산"), else its first
    word that reads as a name ("박도윤 프로젝트?"); ``None`` where none does ("프로젝트 알려줘", "클라우드운영팀
    몇명이야?"). A name is two to four Hangul syllables, no team, none of the words the templates are asked about,
    of time or manner, a modifier nor a request's ending; with a title written together with it ("김하늘팀장님"),
    a full name (``_glued_name``: "개발팀장" is a team's lead, as ``team_in`` reads it; "박도윤팀장" is named, and
    ``team_in`` reads a team in it too, which the templates ask for first)."""
    words = WORD.findall(query)
    stems = [_name_stem(word) for word in words]
    candidates = []
    for at, (stem, marked) in enumerate(stems):
        if not _could_be_a_name(stem) or ("팀" in words[at] and not _glued_name(stem)):
            continue
        # "김하늘 님", "김하늘 팀장님": the next word is an honorific or a title only.
        followed = at + 1 < len(stems) and stems[at + 1][1] and not stems[at + 1][0]
        # A full name (three syllables) right before what is asked about ("오늘 김하늘 자산"), not a modifier
        # ("진행 중인 프로젝트").
        before_topic = len(stem) == 3 and at + 1 < len(words) and _name_stem(words[at + 1])[0] in TOPIC_WORDS
        candidates.append((not (marked or followed), not before_topic, at, stem))
    return min(candidates)[3] if candidates else None


def _teams(query: str) -> list[re.Match[str]]:
    """The teams ``query`` names: the words ending in 팀, but a name with a title and an honorific written together
    with it ("김하늘팀장님": ``_glued_name``), which is a person's ("박도윤팀장", "백엔드팀장" are teams' leads)."""
    return [
        found
        for found in TEAM.finditer(query)
        if not (
            query.startswith(GLUED_TITLES, found.end() - 1)
            and query.startswith(HONORIFIC, found.end() + 1)
            and _glued_name(found.group(1)[:-1])
        )
    ]


def glued_person(query: str, team: str) -> str | None:
    """The person ``team`` (as ``team_in`` read it) may be instead: the name written together with a title
    ("박도윤" of "박도윤팀장 팀원 몇 명이야?", ``_glued_name``), which a template looks up where there is no such
    team; ``None`` where the team cannot be a name ("클라우드운영팀장", "서비스팀원", "김하늘팀 프로젝트")."""
    stem = team.removesuffix("팀")
    glued = any(stem + title in query for title in GLUED_TITLES)
    return stem if glued and _glued_name(stem) else None


def team_in(query: str) -> str | None:
    """The first team ``query`` names ("클라우드운영팀 몇 명", "클라우드운영팀장 누구야", "백엔드팀장 누구야",
    "박도윤팀장": ``glued_person`` may be the one meant); ``None`` where it names none ("김하늘팀장님 프로젝트"
    names a person)."""
    teams = _teams(query)
    return teams[0].group(1) if teams else None


def without_teams(query: str) -> str:
    """``query`` with the teams it names blanked out (what is asked is looked for in the rest: "모니터링팀 몇
    명"), but for the 팀 of a team's lead or members written together with it ("클라우드운영팀장 누구야?": " 팀장
    누구야?")."""
    for found in reversed(_teams(query)):
        kept = "팀" if query.startswith(GLUED_TITLES, found.end() - 1) else ""
        query = f"{query[: found.start()]} {kept}{query[found.end() :]}"
    return query


def failed(result: Any) -> bool:
    """Whether ``MCPHandle.call`` failed (a tool's own answer ``{"ok": false}`` is an answer, not a failure)."""
    return isinstance(result, ToolFailure)


def unanswered(result: Any) -> bool:
    """Whether a call brought nothing to answer from: it failed (``failed``; the tool's own error as a value,
    ``{"error": "인사 시스템 점검 중", "fallback": "retry"}``, fails it as ``tool:error_value``), or its answer
    carries an error beside other data (``mcpregistry.gate.reports_error``), which the gate hands over as an
    answer."""
    return failed(result) or reports_error(as_data(result))


def as_data(result: Any) -> Any:
    """Tool results are JSON text on the demo server; the gate parses them. Keep strings as they are."""
    if isinstance(result, str):
        try:
            return json_loads(result)
        except ValueError:
            return result
    return result


# The gate's reasons a later call may not meet: it did not get through this time (it timed out, hit a rate limit,
# found the server unreachable or answering out of protocol, failed unexpectedly), or the server's breaker is open
# for a while.
RETRY_MAY_FIX = frozenset(
    {"timeout", "rate_limit", "transport", "protocol", "unexpected", "circuit:open", "local:busy"}
)


def unavailable(what: str, result: Any) -> str:
    """The end user's answer where a call brought nothing (``unanswered``): ``what`` (with its particle, "직원
    정보를") could not be fetched, and what to do, by the failure's reason code as the rule path says it
    (``agents.answers.all_calls_failed_text``): "try again later" only where a retry may fix it (``RETRY_MAY_FIX``,
    and an error the tool answered beside its data, which the gate hands over as an answer); an out-of-date tool
    needs an administrator, a value the tool refuses would be refused again. A failure the rule path does not tell
    apart from the retryable ones (an unknown or disabled tool, a disabled server, an answer out of contract) is no
    matter of time here: an administrator must look. A read tool's own error, raised (``tool:error``) or returned
    as a value (``tool:error_value``: "등록되지 않은 직원입니다 (등록된 직원: …)"), is said with its own words
    where the call carries them (``tool_error_text``), as the rule path says it. Never the failure's own message:
    that is the gate's guidance for a model (how to call again), shown on the run page with the call, not to the
    user."""
    code = str(result.get("error") or "") if failed(result) else ""
    if not code or code in RETRY_MAY_FIX:
        return f"{what} 지금 가져오지 못했습니다. 잠시 후 다시 시도해 주세요."
    if code in TOOL_OWN_ERRORS:
        # The rule path's sentence says itself that the information could not be retrieved: said once, of
        # ``what``, then the tool's own words as the rule path quotes them (where the call carries them:
        # ``tool_error_text``).
        sentence = all_calls_failed_text(language="ko", codes=[code])
        quoted = all_calls_failed_text(language="ko", results=[result]).removeprefix(sentence).strip()
        told = f"{what} 가져오지 못했습니다: 도구가 오류를 알렸습니다. 요청 내용을 확인하시거나 잠시 후 다시 시도해 주세요."
        return f"{told} {quoted}" if quoted else told
    said = all_calls_failed_text(language="ko", codes=[code])
    if said == all_calls_failed_text(language="ko", codes=[]):  # the rule path's "try again later"
        said = "다시 시도해도 해결되지 않으니 관리자에게 문의해 주세요."
    return f"{what} 가져오지 못했습니다. {said}"


def ask_for_a_name(example: str) -> str:
    """The answer to a question that names no one (a template never calls a tool with an empty name)."""
    return f"이름을 알려 주세요. (예: {example})"


def project_names(projects: Any) -> str | None:
    """The projects' names, comma-separated; ``None`` where the answer names none: the tool's text (the demo
    server's "no projects", which callers tell as it is), an answer that is no list of projects, a call that brought
    nothing (callers check ``unanswered`` first, to say so in a sentence of their own)."""
    rows = as_data(projects)
    if not isinstance(rows, list) or unanswered(projects):
        return None
    names = [str(p["name"]) for p in rows if isinstance(p, dict) and p.get("name")]
    return ", ".join(names) or None


def asset_kinds(text: str) -> list[tuple[str, list[str]]]:
    """The kinds of asset ``text`` asks for (``ASSET_KINDS``), each as it is written and with the types it stands
    for: "GPU 서버" one kind (a qualifier, ``ASSET_QUALIFIERS``, and 서버: an asset of it has both), "노트북 모니터"
    and "노트북이랑 모니터" two; none where it names no kind ("자산", "장비 뭐 있어?")."""
    named: list[tuple[int, int, list[str]]] = []
    for match in ASSET_KIND.finditer(text):
        kind = ASSET_KINDS[match.group().casefold()]
        qualified = named and named[-1][2][-1] in ASSET_QUALIFIERS
        if qualified and not text[named[-1][1] : match.start()].strip():
            named[-1] = (named[-1][0], match.end(), [*named[-1][2], kind])  # "GPU 서버": one name
        else:
            named.append((match.start(), match.end(), [kind]))
    return [(text[start:end], kinds) for start, end, kinds in named]


def _asset_items(rows: list[Any]) -> list[str]:
    """Each asset by its type and id ("노트북(A-1003)"), one without its id by its type alone."""
    return [
        f"{a.get('type') or '자산'}({a['asset_id']})" if a.get("asset_id") else str(a.get("type") or "자산")
        for a in rows
        if isinstance(a, dict)
    ]


def assets_text(owned: Any) -> str:
    """The assets part of an answer: ``{"count", "assets"}`` listed (``_asset_items``: "자산 2건: 노트북(A-1003), GPU
    서버(A-1008)"), the server's text (no assets) as it is, "not found" for an answer that is neither."""
    if unanswered(owned):
        return unavailable("자산 정보를", owned)
    if isinstance(owned, str):
        return owned  # the server's text: no assets
    rows = owned.get("assets") if isinstance(owned, dict) else None
    if not isinstance(rows, list):
        return "자산 정보를 찾지 못했습니다."
    items = _asset_items(rows)
    if not items:
        return "등록된 자산이 없습니다."
    return f"자산 {owned.get('count', len(items))}건: {', '.join(items)}"


def owned_text(owner: str, owned: dict[str, Any], asked: str) -> str:
    """``owner``'s assets (``owned``: ``{"count", "assets": [...]}``) as ``asked`` asks for them: every one where it
    names no kind (``asset_kinds``: "이서준 님의 자산 2건: 노트북(A-1003), GPU 서버(A-1008)"), else those of the kinds
    it names ("이서준 님의 GPU 서버 1건: GPU 서버(A-1008)"); where the owner has none of them, it says so plainly
    and lists what they have ("이서준 님의 모니터 자산은 없습니다. 보유 자산 2건: …"): never a bare count, which
    reads like a yes."""
    every = [a for a in owned.get("assets") or [] if isinstance(a, dict)]
    named = asset_kinds(asked)
    if not named:
        return f"{owner} 님의 {assets_text(owned)}" if every else f"{owner} 님의 자산은 없습니다."

    def fits(asset: dict[str, Any], kinds: list[str]) -> bool:
        """Whether the asset's type is of every kind of one name ("GPU 서버": GPU and 서버, not a 파일 서버)."""
        return all(kind in str(asset.get("type") or "").casefold() for kind in kinds)

    def of(kinds: list[str]) -> list[dict[str, Any]]:
        return [a for a in every if fits(a, kinds)]

    rows = [a for a in every if any(fits(a, kinds) for _name, kinds in named)]
    missing = ", ".join(name for name, kinds in named if not of(kinds))
    if not rows:
        have = f" 보유 {assets_text(owned)}" if every else ""
        return f"{owner} 님의 {missing} 자산은 없습니다.{have}"
    types = ", ".join(dict.fromkeys(str(a.get("type") or "자산") for a in rows))
    listed = f"{owner} 님의 {types} {len(rows)}건: {', '.join(_asset_items(rows))}"
    return f"{listed}. {missing} 자산은 없습니다." if missing else listed
