// A cited chunk is opened inside its document: bring the highlighted span into view.
const cited = document.querySelector("mark.cited");
if (cited) cited.scrollIntoView({ block: "center" });
