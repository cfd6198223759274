// A cited passage opened inside its document: bring the cited sentence (or else the shaded
// chunk) into view.
const cited = document.getElementById("cited-sentence") || document.querySelector("mark.cited");
if (cited) cited.scrollIntoView({ block: "center" });
