"""The `conversations` suite: multi-turn chats whose later requests resend everything said before, the workload a
prefix store exists for. Generated here from fixed tables (no download, no randomness).

Contract: `conversations()` returns [Conversation] in run order; each has a name, an optional system prompt and
its user turns. A runner (bench/turns.py, scripts/) sends turn N as the chat template over the system prompt,
turns 1..N and the answers to turns 1..N-1, as `specpipe-chat` and an OpenAI client do. Three workloads:
- doc: a ~1.4k-token operations handbook in the first turn, then six questions about it (SmolLM2's tokenizer).
- short: six short turns of small talk, so the reusable part grows a little each turn.
- system-N: one ~1k-token system prompt shared by separate one-turn conversations (an agent's or a support
  desk's instructions): every request after the first finds the system prompt in the store.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Conversation:
    name: str
    turns: list[str]
    system: str | None = None


# ---------------------------------------------------------------- doc: a handbook and questions about it

STATIONS = [
    ("Quayside", 0.0, 4, "the ferry terminal and the fish market"),
    ("Old Mill", 2.4, 2, "the weaving museum"),
    ("Ropewalk", 4.1, 2, "the rope factory and its workshops"),
    ("Saltings", 6.8, 3, "the marsh nature reserve"),
    ("Beacon Hill", 9.5, 2, "the lighthouse and the coastguard station"),
    ("Tanner's Cross", 12.2, 3, "the leather workers' quarter"),
    ("Northgate", 15.0, 4, "the university campus and the hospital"),
]

SECTIONS = [
    (
        "Timetable",
        "On weekdays the first train leaves Quayside at 05:40 and the last at 23:10. Between 07:00 and 09:30 and "
        "again between 16:00 and 18:30 trains run every 6 minutes; at other times every 12 minutes. On Saturdays "
        "trains run every 10 minutes from 07:00 to 22:00, and on Sundays every 15 minutes from 08:00 to 21:00. "
        "A full trip from Quayside to Northgate takes 24 minutes, including a stop of 40 seconds at each station.",
    ),
    (
        "Fares",
        "A single ticket costs 2.10 for up to three stations and 3.40 for a longer trip. A day pass costs 7.50 and "
        "a monthly pass 62.00. Children under 12 travel free with an adult, and students pay half of the single "
        "fare when they show a student card. Tickets bought on the train cost 1.00 more than at the machines.",
    ),
    (
        "Rolling stock",
        "The line owns 14 trains of class HL-9, each with three cars and room for 310 passengers, 96 of them "
        "seated. Eleven trains are needed for the weekday peak; the other three are in reserve or in the depot "
        "at Ropewalk. Each train is inspected every 5,000 kilometres and overhauled every 8 years.",
    ),
    (
        "Maintenance",
        "Track work is done at night between 00:30 and 05:00. Once a month the section between Saltings and "
        "Beacon Hill closes for a whole Sunday so that the sea wall beside the track can be checked, and a bus "
        "replaces the trains on that section. The signalling system was renewed in 2019 and is tested every week.",
    ),
    (
        "Staff",
        "The line employs 212 people: 58 drivers, 34 station staff, 71 engineers, 26 control room operators and "
        "23 office staff. Drivers work shifts of at most 8 hours and must rest for 11 hours between shifts. Every "
        "driver repeats a safety course each year and a simulator test every two years.",
    ),
    (
        "Incidents",
        "In the last year the line recorded 37 delays longer than 10 minutes. Nineteen were caused by signal "
        "faults, nine by storms flooding the track at Saltings, six by passengers taken ill, and three by doors "
        "that would not close. The target for next year is fewer than 25 such delays.",
    ),
    (
        "Accessibility",
        "Every station has step-free access. Quayside, Saltings, Tanner's Cross and Northgate have two lifts each, "
        "and the other stations one. Staff help passengers who book assistance at least one hour ahead, and "
        "guide dogs travel free at all times.",
    ),
    (
        "Lost property",
        "Items found on trains go to the office at Northgate, which opens from 10:00 to 16:00 on weekdays. Items "
        "are kept for 30 days; umbrellas and clothes are then given to charity, and phones and bags go to the "
        "city police.",
    ),
    (
        "Power supply",
        "Trains draw 750 volts from a third rail fed by four substations, at Quayside, Saltings, Tanner's Cross "
        "and Northgate. Any three substations can run the full weekday service, so one can be switched off for "
        "repairs. A diesel generator at the Ropewalk depot keeps the signals and the control room running for 12 "
        "hours if the city grid fails.",
    ),
    (
        "Cleaning",
        "Every train is swept at the end of each day and washed inside and out once a week at the Ropewalk depot. "
        "Stations are cleaned twice a day, and the toilets at Quayside and Northgate every two hours. Graffiti is "
        "removed within 48 hours, or within 4 hours when it is offensive.",
    ),
    (
        "Ticket machines",
        "There are 31 ticket machines on the line, at least two at every station. They take cards, phones and "
        "coins but not notes. A machine that fails is reported automatically to the control room, and the "
        "target is to repair it within one working day; last year the average repair took 14 hours.",
    ),
    (
        "Bicycles",
        "Bicycles travel free outside the peak hours, at most four per car, in the marked area beside the doors. "
        "Folded bicycles and scooters are allowed at all times. Quayside and Northgate each have a guarded bicycle "
        "park with 400 places, open from 05:00 to midnight, which costs 1.00 a day or 10.00 a month.",
    ),
    (
        "Fare inspections",
        "Inspectors check tickets on about one train in five. A passenger without a valid ticket pays a penalty "
        "of 60.00, reduced to 30.00 when paid within 14 days. Last year inspectors checked 410,000 tickets and "
        "issued 5,900 penalties, and the share of passengers without a ticket fell from 2.1 to 1.4 percent.",
    ),
    (
        "Plans",
        "The city has approved an extension of 3.2 km from Northgate to the new housing area at Elm Fields, with "
        "two new stations. Building starts next spring and should take three years. Four more trains of class "
        "HL-9 have been ordered for the extension and for a peak service every 5 minutes.",
    ),
]

DOC_QUESTIONS = [
    "How long does a full trip from Quayside to Northgate take?",
    "How much does a monthly pass cost, and how much is a day pass?",
    "Which section closes once a month, and why?",
    "How many drivers does the line employ, and how long must they rest between shifts?",
    "What caused most of the long delays last year?",
    "Where do items found on trains go, and how long are they kept?",
]


def handbook() -> str:
    """The document of the `doc` conversation (about 1.4k SmolLM2 tokens)."""
    lines = ["Harbour Line operations handbook", "", "Stations"]
    for name, km, platforms, near in STATIONS:
        lines.append(f"- {name}: {km:.1f} km from Quayside, {platforms} platforms, near {near}.")
    for title, text in SECTIONS:
        lines += ["", title, text]
    return "\n".join(lines)


def _doc() -> Conversation:
    first = f"Here is a document.\n\n{handbook()}\n\nAnswer in one or two sentences. {DOC_QUESTIONS[0]}"
    return Conversation("doc", [first, *DOC_QUESTIONS[1:]])


# ---------------------------------------------------------------- short turns

SHORT_TURNS = [
    "Hi! Can you suggest a name for a grey cat?",
    "Why that name?",
    "Give me two more names.",
    "Which of them is the shortest?",
    "Write a one-line poem about the cat.",
    "Thanks, that is all.",
]

# ---------------------------------------------------------------- one system prompt, many requests

RULES = [
    "Greet the customer by name when the name is known, and never invent a name.",
    "Answer in plain English, in at most four sentences, unless the customer asks for more detail.",
    "Never promise a refund; say that the billing team decides within five working days.",
    "Orders can be cancelled free of charge until they are packed; after that, a return is needed.",
    "Returns are accepted within 30 days of delivery for unused items in their original packaging.",
    "Shipping inside the country takes two to four working days; abroad it takes five to ten.",
    "Express shipping costs 9.90 and arrives the next working day when ordered before 14:00.",
    "Gift cards cannot be exchanged for cash and are valid for three years from the date of purchase.",
    "A customer who reports a damaged item is asked for a photo before anything else is done.",
    "Warranty claims need the order number and a short description of the fault.",
    "Batteries and chargers have a warranty of one year; every other product has two years.",
    "Never share another customer's data, and never read out a full card number.",
    "If the customer is angry, apologise once, then move on to what can be done.",
    "Do not discuss products of other shops, and do not compare prices with them.",
    "When a question is about a legal matter, refer the customer to the terms on the website.",
    "Price matching is not offered; discounts come only from the newsletter's monthly codes.",
    "A discount code works once per customer and cannot be combined with another code.",
    "Customers can change the delivery address until the parcel has left the warehouse.",
    "Parcels that could not be delivered wait at the local pick-up point for seven days.",
    "After seven days an uncollected parcel returns to the warehouse and the order is refunded.",
    "Store opening hours are 09:00 to 19:00 on weekdays and 10:00 to 16:00 on Saturdays.",
    "The phone line is open on weekdays from 08:00 to 18:00; chat is open every day.",
    "Business customers with more than 50 orders a year get an account manager.",
    "For a bulk order of more than 100 items, pass the customer to the sales team.",
    "Product manuals can be downloaded from each product's page under the Documents tab.",
    "If a tool call fails, say that the system is slow and try once more before giving up.",
    "Never guess a delivery date; read it from the order status.",
    "Loyalty points are earned at one point per 1.00 spent and expire after two years.",
    "Points can pay for up to half of an order; they cannot pay for shipping.",
    "If a customer asks for a manager, offer a call back within one working day.",
    "Summarise what was agreed at the end of a long conversation, in one sentence.",
    "End each answer by asking whether anything else is needed, in one short sentence.",
]

TOOLS = [
    ("order_status", "order_number", "the order's status, items, delivery date and tracking link"),
    ("cancel_order", "order_number", "whether the order was cancelled; it fails once the order is packed"),
    ("start_return", "order_number, item, reason", "a return label and the return's reference"),
    ("change_address", "order_number, new_address", "whether the new address was accepted"),
    ("gift_card_balance", "card_code", "the card's balance and expiry date"),
    ("warranty_claim", "order_number, fault", "the claim's reference and the next step for the customer"),
]

SYSTEM_QUESTIONS = [
    "Hello, I am Dana. Where is my order 58213?",
    "Can I still cancel order 77120? I ordered it an hour ago.",
    "My new headphones arrived with a cracked case. What should I do?",
    "How long does shipping to Portugal take?",
    "I want to return a jacket I bought three weeks ago. Is that possible?",
    "How long is the warranty on a phone charger?",
    "Can I use two discount codes on one order?",
    "What are your opening hours on Saturday?",
]


def support_system_prompt() -> str:
    """The shared system prompt of the `system-N` conversations (about 1k SmolLM2 tokens)."""
    rules = "\n".join(f"{i + 1}. {rule}" for i, rule in enumerate(RULES))
    tools = "\n".join(f"- {name}({args}): returns {result}." for name, args, result in TOOLS)
    return (
        "You are the customer support assistant of Northwind Home, an online shop for household goods and "
        "electronics. Follow these rules in every answer.\n"
        f"{rules}\n\nYou can call these tools; describe the call you would make in one line when you need one.\n"
        f"{tools}\n\nThe shop's address is 14 Harbour Street, and its website is northwind.example."
    )


def conversations() -> list[Conversation]:
    """Every conversation of the suite, in run order."""
    system = support_system_prompt()
    shared = [Conversation(f"system-{i + 1}", [q], system) for i, q in enumerate(SYSTEM_QUESTIONS)]
    return [_doc(), Conversation("short", list(SHORT_TURNS)), *shared]


def messages_for(conversation: Conversation, turn: int, answers: list[str]) -> list[dict]:
    """The chat messages of `turn` (0-based): the system prompt, earlier turns with their answers, this turn."""
    system = [{"role": "system", "content": conversation.system}] if conversation.system else []
    history = []
    for question, answer in zip(conversation.turns[:turn], answers[:turn]):
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return [*system, *history, {"role": "user", "content": conversation.turns[turn]}]
