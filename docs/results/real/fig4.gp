set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set linetype 1 linecolor rgb '#0072b2' linewidth 2 pointtype 5
set linetype 2 linecolor rgb '#d55e00' linewidth 2 pointtype 6
set linetype 3 linecolor rgb '#009e73' linewidth 2 pointtype 7
set linetype 4 linecolor rgb '#cc79a7' linewidth 2 pointtype 8
set linetype 5 linecolor rgb '#56b4e9' linewidth 2 pointtype 9
set linetype 6 linecolor rgb '#e69f00' linewidth 2 pointtype 10
set linetype 7 linecolor rgb '#000000' linewidth 2 pointtype 11
set linetype 8 linecolor rgb '#999999' linewidth 2 pointtype 12
set linetype cycle 8
set output 'docs/results/real/fig4.png'
set title 'fig4: distinct experts per decode step by batching rule, Llama-4-Maverick-17B-128E-Instruct (held out)'
set xlabel 'decode batch size'
set ylabel 'distinct experts per layer per step'
$d0 << EOD
8 6.65051
16 11.7292
32 19.9671
64 31.7054
EOD
$d1 << EOD
8 6.09726
16 10.6872
32 17.955
64 NaN
EOD
$d2 << EOD
8 6.08622
16 10.4263
32 NaN
64 NaN
EOD
set key below
plot $d0 using 1:2 with linespoints lt 1 dt 1 title 'random', $d1 using 1:2 with linespoints lt 2 dt 1 title 'domain', $d2 using 1:2 with linespoints lt 3 dt 1 title 'cluster'
