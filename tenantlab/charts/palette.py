"""One palette for every chart: the naive design or trap in one colour, the fix in another.

A participant learns the colours once: red-orange is the naive queue (or the trap), green the
corrected one; in timelines, blue is a finished execution and red a crash, in every notebook.
"""

NAIVE = "#d1495b"  # the naive design, the trap, "held", "leaked"
CORRECTED = "#2a9d55"  # the corrected design, the fix, "free", "no leak"
NEUTRAL = "#8c8c8c"

#: What a timeline shows, one colour each (bars by outcome; marks by the same words).
EVENTS = {
    "claim": "#54a24b",
    "done": "#4c78a8",
    "failed": "#f58518",
    "crashed": "#d62728",
    "fenced": "#9467bd",
    "running": "#bdbdbd",
    "dead": "#000000",
    "reaped": "#8c564b",
    "queue empty": "#17becf",
    "alive": "#e0e0e0",
}
