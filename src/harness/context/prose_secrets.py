"""Credentials said in words, in several languages, and the normalisation every detector sees (SPEC C4).

`normalise` undoes the cheap obfuscations before any detector looks: Unicode NFKC (full-width letters,
ligatures, compatibility forms become plain ones) and the removal of invisible characters (zero-width
spaces and joiners, word joiners, soft hyphens, byte-order marks, bidirectional controls, variation
selectors, fillers). It keeps, for each character it produces, the span of the original text it came
from, so a finding in the normalised text is redacted in the original one.

`ProseDetector` finds passwords stated in prose ("the password for the root account is …", "pw: …",
"Passwort: …", "le mot de passe est …", "la contraseña es …", "密码是…", "パスワードは …", …), PINs
("Ihre PIN lautet …", "code confidentiel : …"), passcodes and access, verification and one-time codes
("Zugangscode …", "code à usage unique …", "código de verificación …"), answers to security questions
("security answer: …", "Sicherheitsantwort …", "réponse secrète …", "respuesta de seguridad …"), and
generic secrets ("token: …", "API key is …"). A stated password is taken unless the word after the
connector is an ordinary word of the sentence ("… is incorrect", "… ist zu kurz"); a generic secret only
when its value looks like one (a digit and at least 8 characters), so "the secret to good support is
patience" and "token count: 4821" pass.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable

Span = tuple[int, int, str]

#: characters that render as nothing (or as a blank) but break a pattern apart
_INVISIBLE = frozenset(
    [chr(c) for c in (0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0, 0x2800)]
    + [chr(c) for c in range(0xFE00, 0xFE10)]
    + [chr(c) for c in range(0xE0100, 0xE01F0)]
)


#: every invisible character: the format characters (Unicode category Cf, as of Unicode 15) and the ones
#: above, as a str.translate table that deletes them; a text it leaves unchanged, and NFKC too, is its own
#: normalisation (the fast path)
_CF_RANGES = ((0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F),
              (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E),
              (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
              (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
              (0xE0001, 0xE0001), (0xE0020, 0xE007F))
_DELETE_INVISIBLE: dict[int, None] = {c: None for lo, hi in _CF_RANGES for c in range(lo, hi + 1)} | {
    ord(c): None for c in _INVISIBLE}


def normalise(text: str) -> tuple[str, list[int], list[int]]:
    """(normalised text, start, end): the original span [start[k], end[k]) of each normalised character k."""
    if text.isascii() or (unicodedata.is_normalized("NFKC", text)
                          and len(text.translate(_DELETE_INVISIBLE)) == len(text)):
        indices = list(range(len(text)))
        return text, indices, [i + 1 for i in indices]
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _INVISIBLE or unicodedata.category(ch) == "Cf":
            i += 1
            continue
        j = i + 1
        while j < n and unicodedata.combining(text[j]) and text[j] not in _INVISIBLE:
            j += 1  # a letter with its combining marks normalises as one
        for c in unicodedata.normalize("NFKC", text[i:j]):
            out.append(c)
            starts.append(i)
            ends.append(j)
        i = j
    return "".join(out), starts, ends


def _words(*words: str) -> str:
    return "|".join(sorted(words, key=len, reverse=True))


#: the word for "password" in the languages a support desk meets; CJK and other scripts without spaces
#: are matched without word boundaries
_PASSWORD_LATIN = _words(
    r"pass[\s_-]?words?", r"p[a@4]ssw[o0]rd", "passwd", "passphrase", "passcode", "pwd", "pw",
    r"passwort(?:es)?", "kennwort", r"mot\s+de\s+passe", "mdp", "contraseña", "contrasena", "clave", "senha",
    "wachtwoord", "hasło", "haslo", "heslo", "jelszó", "jelszo", "şifre", "sifre", "parola", r"lösenord(?:et)?",
    r"losenord(?:et)?", r"passord(?:et)?", r"adgangskode(?:n)?", "salasana", "пароль", r"mật\s+khẩu",
    r"kata\s+sandi", r"kata\s+laluan")
_PASSWORD_OTHER = _words("密码", "密碼", "口令", "パスワード", "暗証番号", "비밀번호", "암호", "كلمة المرور",
                         "كلمة السر", "पासवर्ड", "รหัสผ่าน", "סיסמה")
_GENERIC = _words(
    "secret", "token", r"api[\s_-]?key", r"access[\s_-]?key", r"secret[\s_-]?key", r"private[\s_-]?key",
    r"client[\s_-]?secret", r"auth(?:entication|orization)?[\s_-]?(?:token|code|key)", r"access[\s_-]?token",
    r"refresh[\s_-]?token", r"bearer\s+token", r"credentials?", r"license[\s_-]?key", "zugangsdaten", "токен",
    "令牌", "密钥", "秘钥",
    "トークン")
#: a PIN ("PIN", "Geheimzahl", "code confidentiel", "NIP", …)
_PIN = _words(r"pin(?:[\s_-]?(?:code|nummer|number))?", "geheimzahl", r"code\s+confidentiel", r"code\s+pin", "nip",
              r"c[oó]digo\s+pin", r"n[uú]mero\s+pin")
#: a code that lets its holder in: passcodes, access, verification, confirmation and one-time codes, in
#: English, German, French and Spanish
_CODE = _words(
    "passcode", r"access[\s_-]?code", r"security[\s_-]?code", r"confirmation[\s_-]?code", r"otp(?:[\s_-]?code)?",
    r"one[\s_-]time[\s_-](?:password|code|passcode|pin)", r"verification[\s_-]?code", r"login[\s_-]?code",
    r"(?:2fa|mfa|sms|auth(?:entication)?)[\s_-]?code",
    "zugangscode", "einmalcode", r"einmal[\s_-]?passwort", "bestätigungscode", "bestaetigungscode",
    "verifizierungscode", "sicherheitscode", "freigabecode", "tan", "mtan", "smstan",
    r"code\s+d['\u2019]acc[eè]s", r"code\s+(?:à|a)\s+usage\s+unique", r"code\s+de\s+v[ée]rification",
    r"code\s+de\s+s[ée]curit[ée]", r"code\s+de\s+confirmation", r"mot\s+de\s+passe\s+(?:à|a)\s+usage\s+unique",
    r"code\s+(?:otp|sms)",
    r"c[oó]digo\s+de\s+acceso", r"c[oó]digo\s+de\s+verificaci[oó]n", r"c[oó]digo\s+de\s+un\s+solo\s+uso",
    r"c[oó]digo\s+de\s+seguridad", r"c[oó]digo\s+de\s+confirmaci[oó]n", r"c[oó]digo\s+(?:otp|sms)",
    r"contrase[nñ]a\s+de\s+un\s+solo\s+uso", r"clave\s+de\s+acceso")
#: the answer to a security question ("security answer", "Sicherheitsantwort", "réponse secrète", …)
_ANSWER = _words(
    r"security[\s_-]?answer", r"secret[\s_-]?answer", r"answer\s+to\s+(?:the|your|my)\s+security\s+question",
    r"memorable\s+word", r"mother['\u2019]?s\s+maiden\s+name",
    "sicherheitsantwort", r"antwort\s+auf\s+(?:die|ihre|deine|meine)\s+sicherheitsfrage",
    r"r[ée]ponse\s+secr[eè]te", r"r[ée]ponse\s+de\s+s[ée]curit[ée]",
    r"r[ée]ponse\s+(?:à|a)\s+(?:la|votre|ma)\s+question\s+(?:secr[eè]te|de\s+s[ée]curit[ée])",
    r"respuesta\s+de\s+seguridad", r"respuesta\s+secreta",
    r"respuesta\s+a\s+(?:la|su|tu|mi)\s+pregunta\s+(?:secreta|de\s+seguridad)")
#: what may stand between the keyword and the connector: "for the root account", "du serveur", …
_QUALIFIER = (r"(?:\s+(?:for|of|to|on|at|from|für|fürs|von|vom|de|du|des|pour|del|para|do|da|dla|van|voor|för|"
              r"för|til|для|от)\b[^\n.:=?!]{0,60}?)?")
_CONNECTOR = (r"(?:\s*(?::=|=>|->|→|=|:)|\s+[-\u2013\u2014](?=\s)"
              r"|\s+(?:is|was|are|ist|war|lautet|est|es|era|é|è|er|är|on|jest|je|là|adalah|ialah|будет)\b"
              r"(?:\s+(?:now|still|set\s+to|changed\s+to|reset\s+to|updated\s+to))?"
              r"|\s+(?:changed|set|reset|updated)\s+to"
              r"|\s*(?:是|为|為|は|는|은|が))")
#: the ordinary words that follow "password is" in a sentence that states no password
_STOPWORDS = _words(
    "not", "incorrect", "incorrectly", "wrong", "invalid", "expired", "expiring", "expires", "required",
    "correct", "missing", "empty", "blank", "weak", "strong", "secure", "insecure", "changed", "reset", "set",
    "updated", "saved", "stored", "hashed", "encrypted", "mandatory", "optional", "needed", "the", "a", "an",
    "your", "my", "his", "her", "their", "our", "its", "this", "that", "at", "in", "on", "still", "now", "being",
    "been", "no", "none", "null", "shown", "hidden", "visible", "same", "different", "long", "short", "valid",
    "ok", "okay", "fine", "good", "bad", "locked", "unknown", "forgotten", "lost", "sent", "emailed", "too",
    "about", "case-sensitive", "protected", "field", "here", "there", "below", "above", "attached", "provided",
    "included", "enabled", "disabled", "managed", "generated", "random", "unique", "secret", "safe", "unsafe",
    "known", "taken", "used", "requested", "pending", "accepted", "rejected", "ready", "unchanged", "going",
    "please", "to", "for", "of", "and", "or", "by", "with", "from", "what", "which", "where", "how", "why",
    "who", "when", "will", "should", "must", "can", "cannot", "does", "do", "did", "is", "was", "are", "be",
    "it", "you", "me", "we", "they", "yes", "something", "anything", "nothing", "stolen", "leaked",
    "compromised", "rotated", "sensitive", "policy", "manager", "reset", "change", "update", "length",
    "nicht", "falsch", "ungültig", "abgelaufen", "erforderlich", "leer", "zu", "das", "der", "die", "ein",
    "eine", "mein", "dein", "ihr", "sein", "noch", "jetzt", "geändert", "korrekt", "richtig", "sicher",
    "unsicher", "kurz", "lang", "gesperrt", "vergessen", "hier", "unten", "oben",
    "incorrecte", "invalide", "expiré", "requis", "obligatoire", "vide", "trop", "le", "la", "les", "un",
    "une", "mon", "ton", "votre", "pas", "faux", "changé", "oublié", "ici", "sécurisé",
    "incorrecta", "incorrecto", "inválida", "inválido", "obligatoria", "requerida", "vacía", "muy", "el",
    "los", "las", "una", "mi", "tu", "su", "correcta", "segura", "débil", "caducada", "aquí", "que",
    "incorreta", "obrigatória", "vazia", "muito", "o", "um", "uma", "minha", "sua", "não", "correta",
    "onjuist", "ongeldig", "verplicht", "leeg", "te", "het", "de", "een", "mijn", "niet",
    "sbagliata", "errata", "vuota", "troppo", "il", "mia", "non",
    "fel", "felaktigt", "feil", "forkert", "väärä", "ikke", "inte", "ei",
    "nieprawidłowe", "błędne", "wymagane", "puste", "za", "неверный", "неправильный", "обязателен", "пустой",
    "слишком", "не")
_STOP = rf"(?!(?:{_STOPWORDS})(?:[\s.,;:!?)\]\"'`]|$))"
_QUOTED = r"\"(?P<q1>[^\"\n]{1,200})\"|'(?P<q2>[^'\n]{1,200})'|`(?P<q3>[^`\n]{1,200})`"
#: a value: something a password could be (with a Latin letter, digit or symbol; not "********", not an
#: aside in brackets such as "(see the vault)")
_VALUE = r"(?=[^\s]*[A-Za-z0-9!#$%^&+=~@])(?![*•·x]{3,}(?:\s|$))(?![(\[<{])(?P<v>[^\s\"'`,;\u3001\u3002]{1,200})"
_SECRETISH = r"(?=[^\s\"'`]*\d)(?P<v>[^\s\"'`,;\u3001\u3002]{8,200})"
_LATIN_BEFORE = r"(?<![A-Za-zÀ-ɏЀ-ӿ])"
_LATIN_AFTER = r"(?![A-Za-zÀ-ɏЀ-ӿ])"
_KEY_CLOSE = r"[\"']?"  # the closing quote of a JSON or YAML key: "password": "…"

#: (pattern, kind), compiled on the first scrub (with their alternations in many languages, compiling them
#: took ~90 ms of every command's start, most of which never scrubs anything)
_SOURCES: tuple[tuple[str, str], ...] = (
    # a password, stated: keyword (qualifier) connector value, or keyword followed by a quoted value
    (rf"(?:{_LATIN_BEFORE}(?:{_PASSWORD_LATIN}){_LATIN_AFTER}|(?:{_PASSWORD_OTHER})){_KEY_CLOSE}"
     rf"{_QUALIFIER}(?:{_CONNECTOR}\s*(?:[\"'`](?=[^\s]))?|\s+(?=[\"'`]))\s*{_STOP}(?:{_QUOTED}|{_VALUE})", "password"),
    # a password right after its keyword, without a connector, when it looks like one: "with password toor1234"
    (rf"{_LATIN_BEFORE}(?:{_PASSWORD_LATIN}){_LATIN_AFTER}\s+{_STOP}"
     r"(?=[^\s]*\d)(?=[^\s]*[A-Za-z])(?P<v>[^\s\"'`,;]{6,200})", "password"),
    # a PIN: four to eight digits
    (rf"(?:{_LATIN_BEFORE}(?:{_PIN}){_LATIN_AFTER}|暗証番号){_KEY_CLOSE}{_QUALIFIER}"
     rf"(?:{_CONNECTOR})?\s*[\"'`]?(?P<v>\d{{4,8}})(?!\d)", "pin"),
    # a passcode, access, verification or one-time code: digits, or letters with a digit
    (rf"{_LATIN_BEFORE}(?:{_CODE}){_LATIN_AFTER}{_KEY_CLOSE}{_QUALIFIER}(?:{_CONNECTOR})?\s*"
     rf"(?:[\"'`](?=[^\s]))?{_STOP}(?=[^\s\"'`]*\d)(?P<v>[A-Za-z0-9-]{{4,12}})(?![A-Za-z0-9])", "one_time_code"),
    # the answer to a security question, stated: quoted, or the words up to the end of the clause
    (rf"{_LATIN_BEFORE}(?:{_ANSWER}){_LATIN_AFTER}{_KEY_CLOSE}{_CONNECTOR}\s*{_STOP}"
     rf"(?:{_QUOTED}|(?P<v>[^\s\"'`,;.!?][^\n\"'`,;.!?]{{0,60}}))", "security_answer"),
    # a generic secret right after its keyword, when it plainly looks like one: "bearer token abc123…"
    (rf"(?:{_LATIN_BEFORE}(?:{_GENERIC}){_LATIN_AFTER})\s+{_STOP}(?=[^\s]*[A-Za-z])"
     r"(?=[^\s\"'`]*\d)(?P<v>[^\s\"'`,;]{12,200})", "secret"),
    # a generic secret, stated, when its value looks like one
    (rf"(?:{_LATIN_BEFORE}(?:{_GENERIC}){_LATIN_AFTER}){_KEY_CLOSE}{_QUALIFIER}{_CONNECTOR}\s*"
     rf"(?:[\"'`](?=[^\s]))?{_STOP}{_SECRETISH}", "secret"),
)


@functools.cache
def patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    """The compiled patterns, with the kind of credential each finds."""
    return tuple((re.compile(source, re.IGNORECASE), kind) for source, kind in _SOURCES)


class ProseDetector:
    """Credentials stated in words (see the module's docstring)."""

    name = "prose"

    def find(self, text: str) -> Iterable[Span]:
        """Spans of every stated password, PIN or secret value."""
        for pattern, kind in patterns():
            for match in pattern.finditer(text):
                for group in ("q1", "q2", "q3", "v"):
                    if group in pattern.groupindex and match.group(group):
                        yield match.start(group), match.end(group), kind
                        break
