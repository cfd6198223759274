"""Synthetic corpora with known facts, for measuring retrieval without a judge.

A corpus is a set of short profiles (one per person and one per company) written in plain
prose the embedded spaCy extractor reads well ("Alice Varga works for Nordwind Labs as a
chemist."), plus questions whose supporting sentences and entities are known: single facts
and two-hop chains (person -> employer -> headquarters or founder). Every profile is far
shorter than a chunk, so each supporting sentence lives in exactly one chunk.

Names are invented but shaped like real ones so named-entity recognition finds them; the
same seed always gives the same corpus.
"""

import random
from dataclasses import dataclass, field

FIRST_NAMES = [
    "Alice", "Boris", "Clara", "Daniel", "Elena", "Felix", "Greta", "Hugo", "Irene", "Jonas",
    "Karin", "Lukas", "Marta", "Nikolai", "Olivia", "Pavel", "Rosa", "Stefan", "Teresa", "Viktor",
    "Wanda", "Yusuf", "Agnes", "Bruno", "Celine", "Dmitri", "Edith", "Frank", "Helena", "Ivan",
    "Julia", "Konrad", "Lena", "Martin", "Nora", "Oskar", "Paula", "Rafael", "Sofia", "Tobias",
]  # fmt: skip
SURNAMES = [
    "Varga", "Kemp", "Okafor", "Lindqvist", "Moreau", "Halvorsen", "Brandt", "Castellanos", "Novak", "Ferreira",
    "Dahl", "Kowalczyk", "Jansen", "Petrov", "Marchetti", "Eriksen", "Szabo", "Whitfield", "Aldana", "Brennan",
    "Voss", "Takeda", "Mbeki", "Rasmussen", "Olsen", "Duval", "Horvath", "Lindgren", "Quintero", "Haddad",
    "Strand", "Kaminski", "Falk", "Nakamura", "Ortega", "Bauer", "Keller", "Sorensen", "Ivanova", "Brookes",
]  # fmt: skip
COMPANY_STEMS = [
    "Nordwind", "Calder", "Brightwater", "Silverline", "Ironbark", "Bluefjord", "Redcliff", "Stonebridge",
    "Greenhollow", "Northgate", "Eastmere", "Westbrook", "Highmoor", "Clearwell", "Ashford", "Kestrel",
    "Marlowe", "Thornbury", "Oakridge", "Pinecrest",
]  # fmt: skip
COMPANY_SUFFIXES = ["Labs", "Systems", "Robotics", "Dynamics", "Analytics", "Industries", "Corporation", "Energy"]
CITIES = [
    "Oslo", "Lisbon", "Rotterdam", "Tallinn", "Krakow", "Porto", "Gothenburg", "Antwerp", "Helsinki",
    "Bilbao", "Utrecht", "Aarhus", "Gdansk", "Lyon", "Turin", "Bergen", "Graz", "Leipzig", "Seville", "Riga",
]  # fmt: skip
ROLES = ["chemist", "engineer", "data analyst", "designer", "accountant", "geologist", "lawyer", "physicist"]
PRODUCTS = [
    "Heliograph sensor", "Tidewater pump", "Lumen battery", "Corvid drone", "Halcyon turbine", "Quartz scanner",
    "Meridian router", "Falcon valve", "Aurora panel", "Vesper microscope", "Atlas crane", "Zephyr fan",
    "Orion gyroscope", "Juniper filter", "Cobalt engine", "Saffron printer", "Nimbus antenna", "Basalt drill",
    "Emerald laser", "Polaris beacon",
]  # fmt: skip


@dataclass(frozen=True)
class SyntheticDocument:
    title: str
    text: str


@dataclass(frozen=True)
class SyntheticQuestion:
    text: str
    kind: str  # "single" or "two_hop"
    answer: str
    supporting_sentences: tuple[str, ...]
    supporting_documents: tuple[str, ...]
    entities: tuple[str, ...]


@dataclass
class SyntheticCorpus:
    seed: int
    documents: list[SyntheticDocument] = field(default_factory=list)
    questions: list[SyntheticQuestion] = field(default_factory=list)
    entities: dict[str, str] = field(default_factory=dict)  # name -> type


@dataclass
class _Company:
    name: str
    city: str
    founder: str
    year: int
    product: str

    @property
    def sentences(self) -> dict[str, str]:
        return {
            "city": f"{self.name} is headquartered in {self.city}.",
            "founder": f"{self.name} was founded in {self.year} by {self.founder}.",
            "product": f"{self.name} makes the {self.product}.",
        }


@dataclass
class _Person:
    name: str
    company: _Company
    role: str
    home: str
    colleague: str | None = None

    @property
    def sentences(self) -> dict[str, str]:
        sentences = {
            "employer": f"{self.name} works for {self.company.name} as {_article(self.role)} {self.role}.",
            "home": f"{self.name} lives in {self.home}.",
        }
        if self.colleague:
            sentences["colleague"] = f"{self.name} often collaborates with {self.colleague}."
        return sentences


def synthetic_corpus(*, seed: int = 7, people: int = 24, companies: int = 8) -> SyntheticCorpus:
    """A deterministic corpus: `people` person profiles, `companies` company profiles, and
    questions (one single-fact and one two-hop question per person, one per company), in a
    seeded random order."""
    if not 1 <= companies <= len(COMPANY_STEMS):
        raise ValueError(f"companies must be between 1 and {len(COMPANY_STEMS)}")
    if not 1 <= people + companies <= len(FIRST_NAMES):
        raise ValueError(f"people + companies (founders) must be at most {len(FIRST_NAMES)}")
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    person_names = _unique_person_names(rng, people + companies)
    founders, employees = person_names[:companies], person_names[companies:]
    suffixes = [rng.choice(COMPANY_SUFFIXES) for _ in range(companies)]
    company_list = [
        _Company(
            name=f"{stem} {suffix}",
            city=rng.choice(CITIES),
            founder=founder,
            year=rng.randrange(1950, 2015),
            product=product,
        )
        for stem, suffix, founder, product in zip(
            rng.sample(COMPANY_STEMS, companies), suffixes, founders, rng.sample(PRODUCTS, companies), strict=True
        )
    ]
    person_list = [
        _Person(name=name, company=rng.choice(company_list), role=rng.choice(ROLES), home=rng.choice(CITIES))
        for name in employees
    ]
    for person in person_list:
        if rng.random() < 0.5:
            person.colleague = rng.choice([other.name for other in person_list if other is not person])

    corpus = SyntheticCorpus(seed=seed)
    for company in company_list:
        corpus.documents.append(SyntheticDocument(_company_doc(company), _prose(company.sentences)))
        corpus.entities |= {company.name: "organization", company.city: "location", company.founder: "person"}
    for person in person_list:
        corpus.documents.append(SyntheticDocument(_person_doc(person), _prose(person.sentences)))
        corpus.entities |= {person.name: "person", person.home: "location"}
    corpus.questions = _questions(rng, company_list, person_list)
    return corpus


def _unique_person_names(rng: random.Random, count: int) -> list[str]:
    # First names and surnames are both unique, so no two people share either: a
    # question about "Alice" can only mean one person, for the extractor and for us.
    return [
        f"{first} {last}"
        for first, last in zip(rng.sample(FIRST_NAMES, count), rng.sample(SURNAMES, count), strict=True)
    ]


def _article(noun: str) -> str:
    return "an" if noun[0] in "aeiou" else "a"


def _prose(sentences: dict[str, str]) -> str:
    return " ".join(sentences.values())


def _company_doc(company: _Company) -> str:
    return f"Company profile: {company.name}"


def _person_doc(person: _Person) -> str:
    return f"Staff profile: {person.name}"


def _questions(rng: random.Random, companies: list[_Company], people: list[_Person]) -> list[SyntheticQuestion]:
    questions = []
    for company in companies:
        questions.append(
            SyntheticQuestion(
                text=f"Where is {company.name} headquartered?",
                kind="single",
                answer=company.city,
                supporting_sentences=(company.sentences["city"],),
                supporting_documents=(_company_doc(company),),
                entities=(company.name, company.city),
            )
        )
    for person in people:
        company = person.company
        questions.append(
            SyntheticQuestion(
                text=f"Which company does {person.name} work for?",
                kind="single",
                answer=company.name,
                supporting_sentences=(person.sentences["employer"],),
                supporting_documents=(_person_doc(person),),
                entities=(person.name, company.name),
            )
        )
        if rng.random() < 0.5:
            text, fact, answer = (
                f"In which city is the company that employs {person.name} headquartered?",
                "city",
                company.city,
            )
        else:
            text, fact, answer = (f"Who founded the company {person.name} works for?", "founder", company.founder)
        questions.append(
            SyntheticQuestion(
                text=text,
                kind="two_hop",
                answer=answer,
                supporting_sentences=(person.sentences["employer"], company.sentences[fact]),
                supporting_documents=(_person_doc(person), _company_doc(company)),
                entities=(person.name, company.name, answer),
            )
        )
    # Shuffled, so any prefix of the list mixes kinds and subjects.
    rng.shuffle(questions)
    return questions
